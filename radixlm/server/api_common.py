"""What the native routes (http_server.py, generate_api.py) and the OpenAI routes (openai_api.py)
share: the server's state, errors, reading a JSON body within limits, SSE framing, client-disconnect
handling, the queue check and metrics. See docs/architecture.md, "Processes"."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any

from fastapi import Request

from radixlm.config import ServerArgs
from radixlm.engine.tokenizer_manager import EngineDeadError, InternalRequestError, TokenizerManager
from radixlm.engine.tokenizer_pool import TokenizerTimeout
from radixlm.http_access import json_content_type_error
from radixlm.http_common import read_bounded
from radixlm.server.openai_protocol import RequestError, parse_request


class HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


@dataclasses.dataclass
class ServerState:
    server_args: ServerArgs
    tokenizer_manager: TokenizerManager
    scheduler_info: dict
    metrics: Any = None  # radixlm.server.metrics.ServerMetrics when --enable-metrics
    ready: bool = False
    engine_restarts: int = 0  # engines started again after a failure (--restart-on-failure)
    started_at: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def context_len(self) -> int:
        return self.scheduler_info["context_len"]


def srv(request: Request) -> ServerState:
    return request.app.state.srv


def served_model_name(server_args: ServerArgs, info: dict) -> str:
    if server_args.served_model_name:
        return server_args.served_model_name
    return server_args.model_path or os.path.basename(info["model_path"])


# ------------------------------------------------------------------ request bodies
def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):  # "1e999" parses to inf
        raise ValueError(f"the number {s[:40]} is out of range")
    return v


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_unicode(obj: Any) -> None:
    """JSON's \\uXXXX escapes can spell half a UTF-16 surrogate pair, which no valid text holds (the
    tokenizer and the response encoder both fail on it)."""
    stack = [obj]
    while stack:  # iterative: the body may nest as deep as the parser allowed
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise HTTPError(
                    400,
                    "malformed JSON body: a string has an unpaired surrogate escape "
                    "(\\ud800-\\udfff), which is not valid Unicode",
                ) from None
        elif isinstance(x, dict):
            stack.extend(x)
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


# Deepest nesting of arrays and objects a body may have. The parser alone stops near Python's
# recursion limit (~1000), but what handles the values after it (copies, pickling to the
# scheduler, chat templates) recurses too, with less stack left: nesting that parses could still
# fail there. No request needs more (a JSON schema 40 levels deep still fits).
MAX_JSON_DEPTH = 100
_TOO_DEEP = f"malformed JSON body: nested more than {MAX_JSON_DEPTH} levels deep"
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS_ONLY = {c: None for c in range(128) if chr(c) not in "[]{}"}
_INNERMOST = re.compile(r"\[\]|\{\}")


def _too_deep(text: str) -> bool:
    """Nesting depth of valid JSON text, on its brackets outside strings: each pass removes the
    innermost pairs (regex passes, not a Python loop over a body of possibly 32 MiB)."""
    skeleton = _JSON_STRING.sub("", text).translate(
        _BRACKETS_ONLY
    )  # outside strings, JSON is ASCII
    for _ in range(MAX_JSON_DEPTH):
        skeleton = _INNERMOST.sub("", skeleton)
        if not skeleton:
            return False
    return True


def parse_json(body: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN / Infinity (Python's json accepts them), no overflowing floats,
    no integers too long to convert, no unpaired surrogates, nesting at most MAX_JSON_DEPTH."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPError(
            400, f"malformed JSON body: not valid UTF-8 (byte {body[e.start]:#04x} at {e.start})"
        ) from None
    if not text.strip():
        raise HTTPError(400, "the request body is empty; send a JSON object")
    try:
        obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise HTTPError(400, _TOO_DEEP) from None
    except ValueError as e:  # JSONDecodeError, and the checks above
        msg = str(e)
        if "integer string conversion" in msg:  # the interpreter's words for a too long integer
            msg = f"a number has more than {sys.get_int_max_str_digits()} digits"
        raise HTTPError(400, f"malformed JSON body: {msg}") from None
    # Cheap tests on the text first; the passes and walks run only when these cannot rule a problem
    # out.
    if (
        isinstance(obj, (dict, list))
        and text.count("[") + text.count("{") > MAX_JSON_DEPTH
        and _too_deep(text)
    ):
        raise HTTPError(400, _TOO_DEEP)
    if _SURROGATE_ESCAPE.search(text):
        _check_unicode(obj)
    return obj


def _check_content_type(request: Request) -> None:
    problem = json_content_type_error(request.headers.get("content-type"))
    if problem:
        raise HTTPError(415, problem, param="content-type")


async def read_json(request: Request) -> Any:
    """The body as JSON, refused with a 413 once it passes --max-request-body-bytes (checked on
    Content-Length and again while reading, so a chunked upload cannot grow past it)."""
    _check_content_type(request)
    limit = srv(request).server_args.max_request_body_bytes
    too_big = HTTPError(
        413,
        f"the request body is larger than the limit of {limit} bytes (--max-request-body-bytes)",
        param="body",
    )
    return parse_json(await read_bounded(request, limit, too_big))


# ------------------------------------------------------------------ responses
def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(status: int, message: str, kind: str) -> bytes:
    """An error after a stream started (the status line is already sent): as an SSE event."""
    return sse({"error": {"message": message, "type": kind, "param": None, "code": status}})


# What a stream may raise after it started, each shaped by stream_error_event.
STREAM_ERRORS = (HTTPError, ValueError, EngineDeadError, TokenizerTimeout, InternalRequestError)


def stream_error_event(e: BaseException) -> bytes:
    """The error event for one of STREAM_ERRORS: the status a response before the start would have
    had."""
    if isinstance(e, HTTPError):  # e.g. the queue filled while the request was tokenized
        return sse_error(e.status, e.message, e.kind)
    if isinstance(e, ValueError):
        return sse_error(400, str(e), "invalid_request_error")
    if isinstance(e, EngineDeadError):
        return sse_error(503, str(e), "server_error")
    if isinstance(e, TokenizerTimeout):
        return sse_error(504, str(e), "server_error")
    return sse_error(500, str(e), "server_error")


async def run_until_disconnect(request: Request, coro):
    """Await `coro`; if the client goes away first, cancel it (which aborts its requests).
    Waits on the ASGI receive channel: polling request.is_disconnected() never fires behind
    an http middleware."""
    task = asyncio.ensure_future(coro)

    async def gone():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise HTTPError(499, "client disconnected")
    finally:
        watcher.cancel()
        task.cancel()


def check_queue(state: ServerState, incoming: int = 1, field: str = "n") -> None:
    """Refuse `incoming` new sequences (a request's prompts x n) that would queue past the limit."""
    limit = state.server_args.max_queued_requests
    if limit is None:
        return
    running = state.server_args.max_running_requests
    if incoming > limit + running:  # would not fit an empty server either: retrying cannot help
        raise HTTPError(
            400,
            f"the request starts {incoming} sequences (prompts x n), more than the server queues "
            f"(--max-queued-requests {limit} + --max-running-requests {running})",
            param=field,
        )
    queued = len(state.tokenizer_manager.rid_to_state) - running
    if queued + incoming > limit:
        raise HTTPError(
            429,
            f"too many queued requests ({max(queued, 0)} queued + {incoming} new > "
            f"--max-queued-requests {limit}); retry later",
            "rate_limit_error",
        )


def observe(state: ServerState, out: Any) -> None:
    if state.metrics is not None:
        for o in out if isinstance(out, list) else [out]:
            state.metrics.observe_finished(o["meta_info"])


def _inline_defs(schema: dict) -> dict:
    """pydantic's schemas point into their own "$defs" ("#/$defs/X"); inside the OpenAPI document
    such a pointer resolves against the document's root, where nothing is: inline the definitions
    (the request models are not recursive)."""
    defs = schema.get("$defs", {})

    def walk(node):
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return walk({**defs[ref.removeprefix("#/$defs/")], **rest})
        return {k: walk(v) for k, v in node.items() if k != "$defs"}

    return walk(schema)


def json_body(schema: dict) -> dict:
    """`openapi_extra` that documents a route's JSON body (routes read their bodies themselves)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline_defs(schema)}},
        }
    }


def parse_body(cls, body):
    """A request body as the route's pydantic model; a field the model refuses is a 400 naming
    it."""
    try:
        return parse_request(cls, body)
    except RequestError as e:
        raise HTTPError(400, str(e), param=e.param) from None
