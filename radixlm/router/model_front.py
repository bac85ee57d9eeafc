"""Many models behind one server (`radixlm serve --model-path A --model-path B`, `--models-dir`):
the HTTP front. Each model is its own `radixlm serve` child (model_child.py), loaded on first use
and unloaded least-recently-used-first beyond --models-max (model_pool.py).

Every POST route is routed by its JSON body's `model` field (OpenAI, Anthropic, Ollama and the
native APIs alike, whatever routes the children serve) and relayed byte for byte, streams chunk
by chunk; a GET with `?model=NAME` goes to that model. The front answers the listings itself:
/v1/models and /models (OpenAI's list, each model's state in `status`, as llama-server's router
shows it), /api/tags, /api/ps and /api/version (Ollama's), and llama-server's /models/load and
/models/unload.
An unknown model is a 404 naming the choices."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.http_access import (
    AccessConfig,
    AccessMiddleware,
    Refusal,
    Role,
    install_access,
    role_of,
)
from radixlm.http_common import error_json_for
from radixlm.router.model_pool import (
    LOADED,
    ModelPool,
    ModelUnavailable,
    PooledModel,
    UnknownModel,
)
from radixlm.router.proxy import BROWSER_HEADERS, HOP_HEADERS, read_body
from radixlm.version import __version__

logger = logging.getLogger(__name__)

ADMIN_PATHS = ("/models/load", "/models/unload")
_DROPPED = HOP_HEADERS | BROWSER_HEADERS | {"host", "authorization", "x-api-key"}


@dataclass
class FrontArgs:
    access: AccessConfig
    child_key: str  # the children's user key (they require one: they listen on loopback ports)
    child_admin_key: str  # sent on an admin caller's requests only
    max_request_body_bytes: int = 32 * 2**20
    # A child that sends nothing for this long on one request has failed (a long non-streamed
    # answer included).
    read_timeout: float = 1800.0


def _error(
    path: str, status: int, message: str, param: str | None = None, kind: str = ""
) -> Response:
    """In the shape of the path's API: Ollama's {"error": message} for /api/*, else OpenAI's
    (Anthropic's for /v1/messages)."""
    if path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    return error_json_for(path, status, message, kind, param)


def create_model_front_app(pool: ModelPool, args: FrontArgs) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pool.client = httpx.AsyncClient(
            timeout=httpx.Timeout(args.read_timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        try:
            yield
        finally:
            await pool.close()
            await pool.client.aclose()

    app = FastAPI(title="radixlm (several models)", lifespan=lifespan)
    app.add_middleware(AccessMiddleware, admin_paths=ADMIN_PATHS)
    install_access(app, args.access)

    @app.exception_handler(Refusal)
    async def _refused(request: Request, e: Refusal):
        return _error(request.url.path, e.status, e.message, e.param, e.kind)

    def unknown(path: str, name) -> Response:
        return _error(
            path,
            404,
            f"model {name!r} not found; this server's models: {', '.join(pool.names())}",
            "model",
            "not_found_error",
        )

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": {m.name: m.state for m in pool.models.values()}}

    @app.get("/v1/models")
    @app.get("/models")
    async def list_models():
        return {"object": "list", "data": [_openai_card(m) for m in pool.models.values()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str, request: Request):
        try:
            return _openai_card(pool.get(name))
        except UnknownModel:
            return unknown(request.url.path, name)

    @app.get("/api/tags")
    async def tags():
        return {"models": [_ollama_entry(m) for m in pool.models.values()]}

    @app.get("/api/version")  # Ollama's clients ask it first: the front's own, as each child's
    async def version():
        return {"version": __version__}

    @app.get("/api/ps")
    async def running():
        loaded = [m for m in pool.models.values() if m.state == LOADED]
        return {"models": [{**_ollama_entry(m), "size_vram": 0} for m in loaded]}

    @app.post("/models/load")
    @app.post("/models/unload")
    async def load_or_unload(request: Request):
        path = request.url.path
        _, body = await read_body(request, args.max_request_body_bytes)
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str):
            return _error(path, 400, "model: a model name is required", "model")
        try:
            if path == "/models/load":
                await pool.load(name)
                return {"success": True, "model": name, "status": pool.get(name).state}
            return {"success": True, "model": name, "status": await pool.unload(name)}
        except UnknownModel:
            return unknown(path, name)

    @app.post("/{route:path}")
    async def post_route(request: Request, route: str):
        raw, body = await read_body(request, args.max_request_body_bytes)
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            return _error(
                request.url.path,
                400,
                "model: this server serves several models; name one of: " + ", ".join(pool.names()),
                "model",
            )
        return await _proxied(request, name, "POST", raw)

    @app.get("/{route:path}")
    async def get_route(request: Request, route: str):
        name = request.query_params.get("model")
        if not name:
            return _error(
                request.url.path,
                400,
                "model: this server serves several models; add ?model=NAME, one of: "
                + ", ".join(pool.names()),
                "model",
            )
        return await _proxied(request, name, "GET", b"")

    async def _proxied(request: Request, name: str, method: str, raw: bytes) -> Response:
        path = request.url.path
        try:
            m = await pool.acquire(name)
        except UnknownModel:
            return unknown(path, name)
        except ModelUnavailable as e:
            return _error(path, 503, str(e))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        key = args.child_admin_key if role_of(request) >= Role.ADMIN else args.child_key
        headers["authorization"] = f"Bearer {key}"
        url = m.child.url + path + (f"?{request.url.query}" if request.url.query else "")
        try:
            resp = await pool.client.send(
                pool.client.build_request(method, url, content=raw or None, headers=headers),
                stream=True,
            )
        except httpx.HTTPError as e:
            await pool.release(m)
            return _error(path, 502, f"model {name!r}: {type(e).__name__}: {e}")
        return StreamingResponse(
            _relay(pool, m, resp),
            status_code=resp.status_code,
            headers={k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS},
        )

    return app


async def _relay(pool: ModelPool, m: PooledModel, resp: httpx.Response):
    """The child's bytes as they come (SSE and NDJSON streams stay streams); the request stays in
    flight on its model until the last byte or the client's leaving (which closes the child's
    connection: the child aborts the request)."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.HTTPError as e:  # the child died mid-answer: the client's stream just ends
        logger.warning("model %s: the answer broke off (%s)", m.name, e)
    finally:
        await resp.aclose()
        await pool.release(m)


def _openai_card(m: PooledModel) -> dict:
    return {
        "id": m.name,
        "object": "model",
        "created": int(m.spec.modified),
        "owned_by": "radixlm",
        "root": m.spec.path,
        "status": m.as_dict(),
    }


def _ollama_entry(m: PooledModel) -> dict:
    """Ollama's /api/tags item (its field names), plus the model's state in `status`."""
    family = m.spec.family
    return {
        "name": m.name,
        "model": m.name,
        "modified_at": m.spec.modified_at,
        "size": m.spec.size,
        "digest": m.spec.digest,
        "details": {
            "parent_model": "",
            "format": m.spec.format,
            "family": family,
            "families": [family] if family else None,
            "parameter_size": "",
            "quantization_level": "",
        },
        "status": m.as_dict(),
    }
