"""Streaming HTTP clients of `radixlm bench serving`: one request in, timings and counts out.

Backends:
- `radixlm`: native POST /generate with "stream": true. Each SSE event carries the text so
  far (or, with the server's --incremental-streaming-output, a delta), output_ids and
  meta_info (prompt / completion / cached tokens).
- `openai`: POST /v1/completions, streaming, the prompt as text.
- `openai-chat`: POST /v1/chat/completions, streaming.
- `llama-cpp`: llama.cpp's llama-server's own POST /completion, streaming, `return_tokens`.

A request may carry token ids instead of text (`RequestInput.input_ids`): the native backends
(`radixlm`, `llama-cpp`) send them as they are and record the output's ids, so a conversation can
continue on the exact tokens the model produced (as a real model's answers re-tokenize; a random
model's do not).

The OpenAI backends ask for `stream_options.include_usage`, so the server may report
prompt, completion and cached tokens (`usage.prompt_tokens_details.cached_tokens`) in the
last chunk; llama.cpp's llama-server also reports `timings.cache_n`. A count the server
does not report stays None (unknown), never 0.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("radixlm", "openai", "openai-chat", "llama-cpp")


@dataclass
class RequestInput:
    # The prompt as chat messages. Completion backends send the contents concatenated (no
    # template), so a conversation's history is its previous prompt + answer + new message.
    messages: list[dict]
    output_len: int
    ignore_eos: bool = True
    json_schema: dict | None = None  # constrain the output to this schema
    temperature: float = 0.0  # 0: greedy (every benchmark's default; --temperature)
    input_ids: list[int] | None = None  # the prompt as token ids (native backends only)

    @property
    def text(self) -> str:
        return "".join(m["content"] for m in self.messages)


@dataclass
class RequestOutput:
    success: bool = False
    error: str = ""
    text: str = ""
    # What the server reports; None when it does not (filled in from the tokenizer later).
    prompt_len: int | None = None
    output_len: int | None = None
    cached_tokens: int | None = None
    ttft: float | None = None  # seconds from send to the first generated text
    latency: float = 0.0  # seconds from send to the end of the stream
    itl: list[float] = field(default_factory=list)  # gaps between streamed tokens, seconds
    output_ids: list[int] = field(default_factory=list)  # where the backend streams them
    json_valid: bool | None = None  # json workload: the output parses and validates
    retries: int = 0  # sends again after a stale keep-alive connection failed before any answer
    request: RequestInput | None = field(default=None, repr=False)  # what was sent


class Backend:
    path = ""

    def __init__(self, model: str | None = None):
        self.model = model

    def payload(self, req: RequestInput) -> dict:
        raise NotImplementedError

    def update(self, event: dict, out: RequestOutput, state: dict) -> int:
        """Fold one SSE event into `out`; return how many new tokens it carried (0 if none)."""
        raise NotImplementedError


class NativeBackend(Backend):
    path = "/generate"

    def payload(self, req: RequestInput) -> dict:
        sp: dict[str, Any] = {"max_new_tokens": req.output_len, "temperature": req.temperature}
        if req.ignore_eos:
            sp["ignore_eos"] = True
        if req.json_schema is not None:
            sp["json_schema"] = json.dumps(req.json_schema)
        prompt = {"text": req.text} if req.input_ids is None else {"input_ids": req.input_ids}
        return {**prompt, "sampling_params": sp, "stream": True}

    def update(self, event: dict, out: RequestOutput, state: dict) -> int:
        meta = event.get("meta_info", {})
        ids, text = event.get("output_ids"), event.get("text", "")
        n = meta.get("completion_tokens", len(ids) if ids is not None else state.get("n", 0))
        # Cumulative updates carry every output id so far; incremental ones only the new ones.
        if ids is None or len(ids) == n:
            out.text = text
            out.output_ids = list(ids or [])
        else:
            out.text += text
            out.output_ids += ids
        new = n - state.get("n", 0)
        state["n"] = n
        out.output_len = n
        out.prompt_len = meta.get("prompt_tokens", out.prompt_len)
        out.cached_tokens = meta.get("cached_tokens", out.cached_tokens)
        return max(new, 0)


class OpenAIBackend(Backend):
    """/v1/completions; OpenAIChatBackend below changes the prompt and the chunk's text field."""

    path = "/v1/completions"

    def common(self, req: RequestInput) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": req.output_len,
            "temperature": req.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if req.ignore_eos:
            body["ignore_eos"] = (
                True  # an extension that radixlm, llama-server, vLLM and SGLang accept
            )
        return body

    def payload(self, req: RequestInput) -> dict:
        body = {**self.common(req), "prompt": req.text}
        if req.json_schema is not None:
            # Completions have no response_format in OpenAI's API; radixlm, llama-server and
            # SGLang read a top-level json_schema.
            body["json_schema"] = req.json_schema
        return body

    @staticmethod
    def chunk_text(choice: dict) -> str:
        return choice.get("text") or ""

    def update(self, event: dict, out: RequestOutput, state: dict) -> int:
        usage = event.get("usage") or {}
        if usage:
            out.prompt_len = usage.get("prompt_tokens", out.prompt_len)
            out.output_len = usage.get("completion_tokens", out.output_len)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                out.cached_tokens = details["cached_tokens"]
        timings = event.get("timings") or {}  # llama-server
        if out.cached_tokens is None and timings.get("cache_n") is not None:
            out.cached_tokens = timings["cache_n"]
        delta = "".join(self.chunk_text(c) for c in event.get("choices") or [])
        out.text += delta
        return 1 if delta else 0


class OpenAIChatBackend(OpenAIBackend):
    path = "/v1/chat/completions"

    def payload(self, req: RequestInput) -> dict:
        body = {**self.common(req), "messages": req.messages}
        if req.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": req.json_schema},
            }
        return body

    @staticmethod
    def chunk_text(choice: dict) -> str:
        return (choice.get("delta") or {}).get("content") or ""


class LlamaCppBackend(Backend):
    """llama-server's POST /completion: the prompt as text or token ids, `cache_prompt` (its
    per-slot prefix reuse), each chunk's token ids (`return_tokens`), the counts in `timings`."""

    path = "/completion"

    def payload(self, req: RequestInput) -> dict:
        return {
            "prompt": req.text if req.input_ids is None else req.input_ids,
            "n_predict": req.output_len,
            "temperature": req.temperature,
            "ignore_eos": req.ignore_eos,
            "cache_prompt": True,
            "return_tokens": True,
            "stream": True,
            **({"json_schema": req.json_schema} if req.json_schema is not None else {}),
        }

    def update(self, event: dict, out: RequestOutput, state: dict) -> int:
        ids = event.get("tokens") or []
        out.output_ids += ids
        out.text += event.get("content") or ""
        timings = event.get("timings") or {}
        if timings.get("cache_n") is not None:
            out.cached_tokens = timings["cache_n"]
            out.prompt_len = timings["cache_n"] + timings.get("prompt_n", 0)
        if event.get("stop"):
            out.output_len = event.get("tokens_predicted", len(out.output_ids))
        return len(ids)


def make_backend(name: str, model: str | None = None) -> Backend:
    return {
        "radixlm": NativeBackend,
        "openai": OpenAIBackend,
        "openai-chat": OpenAIChatBackend,
        "llama-cpp": LlamaCppBackend,
    }[name](model)


class RequestFailed(Exception):
    pass


def parse_sse_line(line: str) -> dict | None:
    """The JSON object of one `data: {...}` line; None for other lines and `data: [DONE]`."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    event = json.loads(data)
    if isinstance(event, dict) and event.get("error"):
        err = event["error"]
        raise RequestFailed(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    return event


# A server may close an idle keep-alive connection just as the client reuses it (llama-server
# does): the request then fails before any byte of an answer. Such a request never reached the
# server's queue, so it is sent again on a new connection; the clock keeps running from the first
# try.
_STALE_CONNECTION_RETRIES = 2


def _stale_connection(e: Exception) -> bool:
    import httpx

    return isinstance(
        e, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError)
    )


async def send_request(
    client, base_url: str, backend: Backend, req: RequestInput, headers: dict
) -> RequestOutput:
    """Send one streaming request; never raises (a failure is RequestOutput.success False)."""
    start = time.perf_counter()
    for attempt in range(_STALE_CONNECTION_RETRIES + 1):
        out = RequestOutput(request=req)
        got_response = False
        try:
            last = start
            async with client.stream(
                "POST", base_url + backend.path, json=backend.payload(req), headers=headers
            ) as resp:
                got_response = True
                if resp.status_code != 200:
                    body = (await resp.aread()).decode(errors="replace")
                    raise RequestFailed(f"HTTP {resp.status_code}: {body[:300]}")
                state: dict = {}
                async for line in resp.aiter_lines():
                    event = parse_sse_line(line)
                    if event is None:
                        continue
                    new = backend.update(event, out, state)
                    if new:
                        now = time.perf_counter()
                        if out.ttft is None:
                            out.ttft = now - start
                        # several tokens in one chunk: spread the gap over them (as SGLang does)
                        else:
                            out.itl.extend([(now - last) / new] * new)
                        last = now
            out.latency = time.perf_counter() - start
            if (
                out.ttft is None
            ):  # nothing visible streamed (e.g. only special tokens): first = last
                out.ttft = out.latency
            out.success = True
            out.retries = attempt
            return out
        except Exception as e:
            out.error = f"{type(e).__name__}: {e}" if not isinstance(e, RequestFailed) else str(e)
            out.retries = attempt
            if got_response or not _stale_connection(e):
                return out
    return out
