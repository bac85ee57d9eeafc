"""The HTTP server process: a FastAPI app over a TokenizerManager (create_app), with the error
handlers every route shares. The native, SGLang-compatible info, admin and tokenizer routes are
here; /generate is generate_api.py's, the OpenAI-compatible routes openai_api.py's, and each other
API has its own APIRouter module; what they share is in api_common.py. See docs/architecture.md,
"Request flow"."""

from __future__ import annotations

import dataclasses
import logging
import re
import warnings
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.engine.tokenizer_manager import EngineDeadError, InternalRequestError
from radixlm.engine.tokenizer_pool import TokenizerTimeout
from radixlm.http_access import AccessMiddleware, Refusal, abort_target
from radixlm.http_common import error_json, error_json_for
from radixlm.http_dashboard import OPEN_PATHS as DASHBOARD_OPEN_PATHS
from radixlm.ipc import EmbeddingReqInput, GenerateReqInput
from radixlm.server.anthropic_api import router as anthropic_router
from radixlm.server.api_common import (
    HTTPError,
    ServerState,
    json_body,
    read_json,
    served_model_name,
    srv,
)
from radixlm.server.dashboard_api import router as dashboard_router
from radixlm.server.embedding_api import router as embedding_router
from radixlm.server.generate_api import router as generate_router
from radixlm.server.infill_api import router as infill_router
from radixlm.server.llama_api import llama_tokenize
from radixlm.server.llama_api import router as llama_router
from radixlm.server.lora_api import LORA_ADMIN_PATHS
from radixlm.server.lora_api import router as lora_router
from radixlm.server.observability_api import (
    ADMIN_PATHS as OBSERVABILITY_ADMIN_PATHS,
)
from radixlm.server.observability_api import (
    router as observability_router,
)
from radixlm.server.ollama_api import router as ollama_router
from radixlm.server.openai_api import router as openai_router
from radixlm.server.rerank_api import router as rerank_router
from radixlm.server.responses_api import router as responses_router
from radixlm.server.rl_api import RL_ADMIN_PATHS
from radixlm.server.rl_api import router as rl_router
from radixlm.server.score_api import router as score_router
from radixlm.server.session_api import router as session_router
from radixlm.version import __version__

logger = logging.getLogger(__name__)

__all__ = ["ServerState", "create_app", "served_model_name"]

router = APIRouter()


# ---------------------------------------------------------------------- info
@router.get("/health")
async def health(request: Request):
    state = getattr(request.app.state, "srv", None)
    if state is None or not state.ready:
        return Response("starting", status_code=503)
    if state.tokenizer_manager.dead_message:
        return Response(state.tokenizer_manager.dead_message, status_code=503)
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request):
    state = getattr(request.app.state, "srv", None)
    if state is None or not state.ready or state.tokenizer_manager.dead_message:
        return Response("not ready", status_code=503)
    obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
    if state.scheduler_info.get("is_embedding"):  # an embedding server: one prefill-only request
        obj = EmbeddingReqInput(input_ids=[[0]], sampling_params={"max_new_tokens": 0})
    try:
        async for _ in state.tokenizer_manager.generate_request(obj):
            pass
    except (EngineDeadError, InternalRequestError) as e:
        return Response(str(e), status_code=503)
    return Response(status_code=200)


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request):
    s = srv(request)
    return {
        "model_path": s.scheduler_info["model_path"],
        "served_model_name": served_model_name(s.server_args, s.scheduler_info),
        "tokenizer_path": s.server_args.tokenizer_path or s.scheduler_info["model_path"],
        "is_generation": not s.scheduler_info.get("is_embedding"),
        "architectures": [s.scheduler_info["architecture"]],
        "context_length": s.scheduler_info["context_len"],
        "bos_token_id": s.tokenizer_manager.tokenizer.bos_token_id,
        "eos_token_id": s.tokenizer_manager.tokenizer.eos_token_id,
        # SGLang's key: the sampling values a request gets for what it leaves unset
        # (--sampling-defaults)
        "preferred_sampling_params": s.scheduler_info.get("sampling_defaults") or None,
    }


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request):
    s = srv(request)
    internal = await s.tokenizer_manager.get_internal_state()
    args = dataclasses.asdict(s.server_args)
    for secret in ("api_key", "admin_api_key", "hicache_storage_key"):
        if args.get(secret):
            args[secret] = "***"
    return {
        **args,
        "version": __version__,
        "max_total_num_tokens": s.scheduler_info["max_total_num_tokens"],
        "kv_cache_bytes": s.scheduler_info["kv_cache_bytes"],
        "context_len": s.scheduler_info["context_len"],
        "scheduler_pid": s.scheduler_info["pid"],
        "detokenizer_pid": s.scheduler_info.get("detokenizer_pid"),
        "pooling": s.scheduler_info.get(
            "pooling"
        ),  # --is-embedding: the model's pooling (model/pooler.py)
        "engine_restarts": s.engine_restarts,
        # Requests the HTTP side still tracks (0 when idle: nothing leaked on this side).
        "num_tracked_requests": len(s.tokenizer_manager.rid_to_state),
        "internal_state": internal,
    }


# --------------------------------------------------------------------- admin
# Routes only the admin may call (AccessMiddleware); /abort_request's abort-all part is checked in
# the route.
ADMIN_PATHS = ("/flush_cache", "/slots", *RL_ADMIN_PATHS, *LORA_ADMIN_PATHS)


@router.post("/flush_cache")  # POST only: a GET is what a page's <img> or link can send
async def flush_cache(request: Request, level: str = "l1"):
    """level (query): l1 empties the KV pool (the hierarchical cache keeps what it moved to host
    memory and storage); l2 also the host tier; l3 also the storage tier."""
    ok = await srv(request).tokenizer_manager.flush_cache(level)
    if not ok.success:
        return error_json(400, f"cache not flushed: {ok.message}")
    return Response("Cache flushed.", status_code=200)


@router.post(
    "/abort_request",
    openapi_extra=json_body(
        {
            "type": "object",
            "properties": {"rid": {"type": "string"}, "abort_all": {"type": "boolean"}},
        }
    ),
)
async def abort_request(request: Request):
    try:
        rid = abort_target(await read_json(request), request)
    except Refusal as e:
        raise HTTPError(e.status, e.message, e.kind, e.param) from None
    srv(request).tokenizer_manager.abort_request(rid)
    return Response(status_code=200)


_TEXTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


@router.post(
    "/tokenize",
    openapi_extra=json_body(
        {"type": "object", "properties": {"text": _TEXTS}, "required": ["text"]}
    ),
)
async def tokenize(request: Request):
    """radixlm's {text} -> {tokens, count, max_model_len}, or llama-server's {content, add_special,
    parse_special, with_pieces} -> {tokens} (told apart by the field content)."""
    body = await read_json(request)
    s = srv(request)
    if isinstance(body, dict) and "content" in body and "text" not in body:
        return await llama_tokenize(s, body)
    text = body.get("text", body.get("prompt")) if isinstance(body, dict) else None
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise HTTPError(
            400, "tokenize needs a string (or list of strings) field text", param="text"
        )
    ids = await _tokenize_texts(s, texts)
    if isinstance(text, str):
        return {
            "tokens": ids[0],
            "count": len(ids[0]),
            "max_model_len": s.scheduler_info["context_len"],
        }
    return {"tokens": ids, "count": [len(i) for i in ids]}


@router.post(
    "/detokenize",
    openapi_extra=json_body(
        {
            "type": "object",
            "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}},
            "required": ["tokens"],
        }
    ),
)
async def detokenize(request: Request):
    body = await read_json(request)
    toks = body.get("tokens") if isinstance(body, dict) else None
    s = srv(request)
    vocab = s.scheduler_info["vocab_size"]
    if not isinstance(toks, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in toks
    ):
        raise HTTPError(
            400,
            f"detokenize needs a field tokens: a list of token ids in [0, {vocab})",
            param="tokens",
        )
    if len(toks) > s.context_len:
        raise HTTPError(
            400,
            f"tokens has {len(toks)} token ids, more than the context length {s.context_len}",
            param="tokens",
        )
    tm = s.tokenizer_manager
    text = await tm.tokenizer_pool.run(tm.tokenizer.decode, toks, what="detokenizing")
    return {"text": text, "content": text}  # radixlm's field and llama-server's


async def _tokenize_texts(s: ServerState, texts: list[str]) -> list[list[int]]:
    """/tokenize's texts, each at most the context length (as vLLM), on the tokenizer threads."""
    cap = s.server_args.max_client_batch_size
    if len(texts) > cap:
        raise HTTPError(
            400,
            f"text has {len(texts)} items, more than --max-client-batch-size {cap}",
            param="text",
        )
    tm = s.tokenizer_manager

    def encode_all() -> list[list[int]]:
        out = []
        for t in texts:
            try:  # refuses a text far past the context before tokenizing all of it
                ids = tm.encode_prompt(t)
            except ValueError as e:
                raise HTTPError(400, f"text: {e}", param="text") from None
            if len(ids) > s.context_len:
                raise HTTPError(
                    400,
                    f"text has {len(ids)} tokens, more than the context length {s.context_len}",
                    param="text",
                )
            out.append(ids)
        return out

    return await tm.tokenizer_pool.run(encode_all, what="tokenizing the text")


def _openapi_with_unique_ids(app: FastAPI) -> dict:
    """FastAPI's document, but a route with several methods (/generate: POST and PUT) gets an
    operationId per method: FastAPI gives them all one (and warns), OpenAPI wants them unique."""
    if app.openapi_schema is None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Duplicate Operation ID")
            schema = FastAPI.openapi(app)
        for ops in schema["paths"].values():
            ids = [op.get("operationId") for op in ops.values()]
            for method, op in ops.items():
                if op.get("operationId") and ids.count(op["operationId"]) > 1:
                    op["operationId"] = re.sub(r"_[a-z]+$", "", op["operationId"]) + "_" + method
    return app.openapi_schema


def create_app(state_factory) -> FastAPI:
    """`state_factory()` runs on the server's event loop at start-up and returns a ServerState."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.srv = await state_factory()
        app.state.srv.ready = True
        yield
        await app.state.srv.tokenizer_manager.close()

    app = FastAPI(title="radixlm", version=__version__, lifespan=lifespan)
    app.openapi = lambda: _openapi_with_unique_ids(app)
    app.add_middleware(
        AccessMiddleware,
        admin_paths=ADMIN_PATHS + OBSERVABILITY_ADMIN_PATHS,
        open_paths=DASHBOARD_OPEN_PATHS,
    )
    app.include_router(generate_router)
    app.include_router(router)
    app.include_router(openai_router)
    app.include_router(observability_router)
    app.include_router(score_router)
    app.include_router(rerank_router)
    app.include_router(embedding_router)
    app.include_router(infill_router)
    app.include_router(llama_router)
    app.include_router(rl_router)
    app.include_router(session_router)
    app.include_router(lora_router)
    app.include_router(anthropic_router)
    app.include_router(responses_router)
    app.include_router(ollama_router)
    app.include_router(dashboard_router)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, e: HTTPError):
        return error_json(e.status, e.message, e.kind, e.param)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, e: StarletteHTTPException):
        # The router's own answers (unknown path: 404, method not allowed: 405) in the one error
        # shape.
        response = error_json_for(
            request.url.path,
            e.status_code,
            str(e.detail),
            "not_found_error" if e.status_code == 404 else "invalid_request_error",
        )
        response.headers.update(e.headers or {})
        return response

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, e: EngineDeadError):
        return error_json(503, str(e), "server_error")

    @app.exception_handler(TokenizerTimeout)
    async def _tokenizer_timeout(request: Request, e: TokenizerTimeout):
        return error_json(504, str(e), "server_error")

    @app.exception_handler(InternalRequestError)
    async def _failed(request: Request, e: InternalRequestError):
        # Generic, with the request id the server log names (tokenizer_manager.py logs the details).
        response = error_json(500, str(e), "server_error")
        response.headers["X-Request-Id"] = e.rid
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        # Only path parameters are declared (bodies are parsed by the routes themselves).
        err = (e.errors() or [{}])[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        return error_json(
            400, f"invalid {where}: {err.get('msg', 'bad value')}", param=where or None
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        # Logged here with its traceback; the client gets no trace, path or exception text.
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return error_json(500, "internal server error (see the server log)", "server_error")

    return app
