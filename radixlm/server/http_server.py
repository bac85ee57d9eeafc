"""The HTTP server process: FastAPI app over a TokenizerManager (native SGLang-compatible API;
the OpenAI-compatible routes live in openai_api.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import radixlm
from radixlm.config import ServerArgs
from radixlm.engine.tokenizer_manager import EngineDeadError, TokenizerManager
from radixlm.http_common import APIKeyMiddleware, error_json
from radixlm.ipc import GenerateReqInput

logger = logging.getLogger(__name__)

# SGLang request fields radixlm accepts only at their "off" value (multimodal, LoRA, ...).
_IGNORED_WHEN_EMPTY = {
    "image_data", "video_data", "audio_data", "lora_path", "modalities", "session_params",
    "custom_logit_processor", "return_hidden_states", "bootstrap_host", "bootstrap_port", "bootstrap_room",
    "data_parallel_rank", "log_metrics",
}
_GENERATE_FIELDS = {f.name for f in dataclasses.fields(GenerateReqInput)}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


@dataclasses.dataclass
class ServerState:
    server_args: ServerArgs
    tokenizer_manager: TokenizerManager
    scheduler_info: dict
    metrics: Any = None  # radixlm.server.metrics.ServerMetrics when --enable-metrics
    ready: bool = False


def parse_generate_body(body: Any) -> GenerateReqInput:
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    unknown = sorted(k for k in body if k not in _GENERATE_FIELDS and k not in _IGNORED_WHEN_EMPTY)
    unsupported = sorted(k for k in body if k in _IGNORED_WHEN_EMPTY and body[k] not in (None, False, [], {}, ""))
    if unknown:
        raise HTTPError(400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    if unsupported:
        raise HTTPError(400, f"unsupported field(s): {', '.join(unsupported)}", param=unsupported[0])
    kw = {k: v for k, v in body.items() if k in _GENERATE_FIELDS}
    if "text" in kw and "input_ids" in kw and kw["input_ids"] is None:
        kw.pop("input_ids")
    try:
        return GenerateReqInput(**kw)
    except (TypeError, ValueError) as e:
        raise HTTPError(400, str(e)) from None


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


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


def create_app(state_factory) -> FastAPI:
    """`state_factory()` runs on the server's event loop at start-up and returns a ServerState."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.srv = await state_factory()
        app.state.srv.ready = True
        yield
        await app.state.srv.tokenizer_manager.close()

    app = FastAPI(title="radixlm", version=radixlm.__version__, lifespan=lifespan)

    def srv(request: Request) -> ServerState:
        return request.app.state.srv

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, e: HTTPError):
        return error_json(e.status, e.message, e.kind, e.param)

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, e: EngineDeadError):
        return error_json(503, str(e), "server_error")

    app.add_middleware(APIKeyMiddleware)

    async def read_json(request: Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HTTPError(400, f"malformed JSON body: {e}") from None

    # ------------------------------------------------------------ generate
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        state = srv(request)
        obj = parse_generate_body(await read_json(request))
        check_queue(state)
        gen = state.tokenizer_manager.generate_request(obj)
        if obj.stream:
            return StreamingResponse(stream_native(state, gen, obj), media_type="text/event-stream")

        async def collect():
            out = None
            async for out in gen:
                pass
            return out

        try:
            out = await run_until_disconnect(request, collect())
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        observe(state, out)
        return JSONResponse(out)

    async def stream_native(state: ServerState, gen: AsyncIterator, obj: GenerateReqInput):
        incremental = state.server_args.incremental_streaming_output
        sent: dict[int, tuple[int, int]] = {}
        try:
            async for out in gen:
                if incremental:
                    idx = out.get("index", 0)
                    nt, ni = sent.get(idx, (0, 0))
                    text, ids = out["text"], out["output_ids"]
                    sent[idx] = (len(text), len(ids))
                    out = {**out, "text": text[nt:], "output_ids": ids[ni:]}
                if out["meta_info"].get("finish_reason") is not None:
                    observe(state, out)
                yield sse(out)
        except ValueError as e:
            yield sse({"error": {"message": str(e), "type": "invalid_request_error", "code": 400}})
        except EngineDeadError as e:
            yield sse({"error": {"message": str(e), "type": "server_error", "code": 503}})
        yield SSE_DONE

    def check_queue(state: ServerState) -> None:
        limit = state.server_args.max_queued_requests
        if limit is None:
            return
        queued = len(state.tokenizer_manager.rid_to_state) - state.server_args.max_running_requests
        if queued >= limit:
            raise HTTPError(429, f"too many queued requests ({queued} >= --max-queued-requests {limit}); retry later", "rate_limit_error")

    def observe(state: ServerState, out: Any) -> None:
        if state.metrics is not None:
            for o in out if isinstance(out, list) else [out]:
                state.metrics.observe_finished(o["meta_info"])

    # -------------------------------------------------------------- info
    @app.get("/health")
    async def health(request: Request):
        state = getattr(request.app.state, "srv", None)
        if state is None or not state.ready:
            return Response("starting", status_code=503)
        if state.tokenizer_manager.dead_message:
            return Response(state.tokenizer_manager.dead_message, status_code=503)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        state = getattr(request.app.state, "srv", None)
        if state is None or not state.ready or state.tokenizer_manager.dead_message:
            return Response("not ready", status_code=503)
        obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
        try:
            async for _ in state.tokenizer_manager.generate_request(obj):
                pass
        except EngineDeadError as e:
            return Response(str(e), status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info(request: Request):
        s = srv(request)
        return {
            "model_path": s.scheduler_info["model_path"],
            "served_model_name": served_model_name(s.server_args, s.scheduler_info),
            "tokenizer_path": s.server_args.tokenizer_path or s.scheduler_info["model_path"],
            "is_generation": True,
            "architectures": [s.scheduler_info["architecture"]],
            "context_length": s.scheduler_info["context_len"],
            "bos_token_id": s.tokenizer_manager.tokenizer.bos_token_id,
            "eos_token_id": s.tokenizer_manager.tokenizer.eos_token_id,
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info(request: Request):
        s = srv(request)
        internal = await s.tokenizer_manager.get_internal_state()
        args = dataclasses.asdict(s.server_args)
        if args.get("api_key"):
            args["api_key"] = "***"
        return {
            **args,
            "version": radixlm.__version__,
            "max_total_num_tokens": s.scheduler_info["max_total_num_tokens"],
            "kv_cache_bytes": s.scheduler_info["kv_cache_bytes"],
            "context_len": s.scheduler_info["context_len"],
            "scheduler_pid": s.scheduler_info["pid"],
            "internal_state": internal,
        }

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request):
        ok = await srv(request).tokenizer_manager.flush_cache()
        if not ok.success:
            return error_json(400, f"cache not flushed: {ok.message}")
        return Response("Cache flushed.", status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await read_json(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise HTTPError(400, "abort_request needs a string field rid", param="rid")
        srv(request).tokenizer_manager.abort_request(rid)
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_json(request)
        text = body.get("text", body.get("prompt")) if isinstance(body, dict) else None
        if isinstance(text, str):
            ids = srv(request).tokenizer_manager.tokenizer.encode(text)
            return {"tokens": ids, "count": len(ids), "max_model_len": srv(request).scheduler_info["context_len"]}
        if isinstance(text, list) and all(isinstance(t, str) for t in text):
            ids = [srv(request).tokenizer_manager.tokenizer.encode(t) for t in text]
            return {"tokens": ids, "count": [len(i) for i in ids]}
        raise HTTPError(400, "tokenize needs a string (or list of strings) field text", param="text")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request)
        toks = body.get("tokens") if isinstance(body, dict) else None
        vocab = srv(request).scheduler_info["vocab_size"]
        if not isinstance(toks, list) or not all(isinstance(t, int) and 0 <= t < vocab for t in toks):
            raise HTTPError(400, f"detokenize needs a field tokens: a list of token ids in [0, {vocab})", param="tokens")
        return {"text": srv(request).tokenizer_manager.tokenizer.decode(toks)}

    from radixlm.server.openai_api import register_openai_routes

    register_openai_routes(app, srv, HTTPError, read_json, check_queue, observe, run_until_disconnect)
    return app


def served_model_name(server_args: ServerArgs, info: dict) -> str:
    if server_args.served_model_name:
        return server_args.served_model_name
    import os

    return server_args.model_path or os.path.basename(info["model_path"])
