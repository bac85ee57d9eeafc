"""The router's HTTP server: one endpoint in front of the workers (FastAPI + uvicorn, httpx).

Generation routes (native /generate, OpenAI completions and chat) go to the worker the policy
picks and come back byte for byte, retried on another worker when theirs fails before answering
(proxy.py; the router's options and state: state.py). /flush_cache and /abort_request go to every
verified worker, /get_server_info gathers every worker's, /health is 200 while one worker is
healthy. The other APIs' POST routes (Messages, Responses, embeddings, score, infill, tokenize) go
where the policy picks too. A session (/open_session) stays on the worker that opened it: its turns
(/generate with session_params) and its close go there, without retries elsewhere (affinity.py).

Access (radixlm/http_access.py): --api-key for clients; --admin-api-key for the admin routes
(/add_worker, /remove_worker, /flush_cache, and /abort_request of every request), which reach the
workers with --worker-admin-api-key; a user's abort goes out as an abort of its one rid. Bodies
are bounded (--max-request-body-bytes) and every upstream wait is finite (--connect-timeout-secs,
--request-timeout-secs).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixlm.http_access import (
    AccessConfig,
    AccessMiddleware,
    Refusal,
    abort_target,
    install_access,
    presented_key,
)
from radixlm.http_common import error_json
from radixlm.http_dashboard import OPEN_PATHS as DASHBOARD_OPEN_PATHS
from radixlm.router.affinity import client_owner, session_id_of
from radixlm.router.dashboard import router_dashboard
from radixlm.router.policies import Policy
from radixlm.router.proxy import broadcast, forward, forward_get, forward_once, read_body
from radixlm.router.routing_text import routing_text
from radixlm.router.state import RouterArgs, RouterState
from radixlm.router.workers import WorkerNotAllowed, normalize_url

logger = logging.getLogger(__name__)

GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
# Routed by the policy too, on their text where they have one (routing_text.py).
OTHER_POST_PATHS = (
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/embeddings",
    "/encode",
    "/v1/score",
    "/infill",
    "/tokenize",
    "/detokenize",
)
ADMIN_PATHS = ("/add_worker", "/remove_worker", "/flush_cache")


def create_router_app(args: RouterArgs, policy: Policy | None = None) -> FastAPI:
    state = RouterState(args, policy)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.client = httpx.AsyncClient(
            timeout=httpx.Timeout(args.request_timeout, connect=args.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        await state.registry.check_all(state.client)  # know who is up before the first request
        tasks = [
            asyncio.ensure_future(state.registry.run_health_checks(state.client)),
            asyncio.ensure_future(_maintain(state)),
        ]
        if state.kv is not None:
            state.kv.start()
            await state.kv.discover(state.registry, state.client)
            discovery = state.kv.run_discovery(state.registry, state.client)
            tasks.append(asyncio.ensure_future(discovery))
        yield
        for t in tasks:
            t.cancel()
        if state.kv is not None:
            state.kv.shutdown()
        await state.client.aclose()

    app = FastAPI(title="radixlm router", lifespan=lifespan)
    app.state.router = state
    app.add_middleware(AccessMiddleware, admin_paths=ADMIN_PATHS, open_paths=DASHBOARD_OPEN_PATHS)
    install_access(
        app, AccessConfig(args.api_key, args.admin_api_key, args.host, tuple(args.allowed_origins))
    )

    @app.exception_handler(Refusal)
    async def _refused(request: Request, e: Refusal):
        return error_json(e.status, e.message, e.kind, e.param)

    # /dashboard: every worker side by side, gathered only while a page is open.
    app.include_router(
        router_dashboard(
            lambda: [w.as_dict() for w in state.registry.workers.values()],
            lambda: broadcast(state, "GET", "/get_server_info", timeout=5.0),
        )
    )

    for path in GENERATE_PATHS + OTHER_POST_PATHS:

        async def generate(request: Request, path=path):
            raw, body = await read_body(request, args.max_request_body_bytes)
            sid = session_id_of(body) if path == "/generate" else None
            if sid is None:
                tokens = (
                    await state.kv.tokens(state.registry, state.client, path, body)
                    if state.kv
                    else None
                )
                text = routing_text(path, body)
                return await forward(state, request, path, raw, text, tokens=tokens)
            home = state.sessions.home(sid, client_owner(presented_key(request.headers)))
            if home is None:
                return error_json(
                    400, f"session_params.id: no open session {sid!r}", param="session_params.id"
                )
            return await forward(state, request, path, raw, "", pinned=home)

        app.add_api_route(path, generate, methods=["POST"])

    @app.post("/open_session")
    async def open_session(request: Request):
        """On the policy's worker; the session's later turns and its close go to the same one."""
        raw, _ = await read_body(request, args.max_request_body_bytes)
        url = state.pick("")
        if url is None:
            return error_json(503, "no healthy worker", "server_error")
        resp = await forward_once(state, request, url, "/open_session", raw)
        if resp.status_code == 200:
            state.sessions.record(
                json.loads(resp.body), url, client_owner(presented_key(request.headers))
            )
        return resp

    @app.post("/close_session")
    async def close_session(request: Request):
        raw, body = await read_body(request, args.max_request_body_bytes)
        sid = body.get("session_id") if isinstance(body, dict) else None
        home = (
            state.sessions.home(sid, client_owner(presented_key(request.headers)))
            if isinstance(sid, str)
            else None
        )
        if home is None:
            return error_json(400, f"session_id: no open session {sid!r}", param="session_id")
        resp = await forward_once(state, request, home, "/close_session", raw)
        if resp.status_code < 500:  # closed, or the worker no longer has it (timed out)
            state.sessions.forget(sid)
        return resp

    @app.get("/health")
    async def health():
        n = len(state.registry.healthy())
        return JSONResponse({"healthy_workers": n}, status_code=200 if n else 503)

    @app.get("/v1/models")
    @app.get("/get_model_info")
    @app.get("/model_info")
    async def one_worker_get(request: Request):
        return await forward_get(state, request.url.path)

    @app.post("/flush_cache")  # POST only: a GET is what a page's <img> or link can send
    async def flush_cache():
        results = await broadcast(state, "POST", "/flush_cache", headers=state.admin_headers)
        ok = all(r.get("status", 500) < 300 for r in results.values())
        return JSONResponse({"workers": results}, status_code=200 if ok else 502)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        # Sent on as the one rid it names (the workers cannot tell a user's empty rid from the
        # admin's).
        rid = abort_target((await read_body(request, args.max_request_body_bytes))[1], request)
        body, headers = (
            ({"rid": rid}, state.registry.headers)
            if rid
            else ({"abort_all": True}, state.admin_headers)
        )
        return JSONResponse(
            {
                "workers": await broadcast(
                    state, "POST", "/abort_request", json.dumps(body).encode(), headers=headers
                )
            }
        )

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info():
        infos = await broadcast(state, "GET", "/get_server_info")
        return {"router": router_info(state), "workers": infos}

    @app.get("/list_workers")
    async def list_workers():
        return {"workers": [w.as_dict() for w in state.registry.workers.values()]}

    @app.post("/add_worker")
    async def add_worker(url: str):
        """The worker gets traffic once verified (now, or by a later health check)."""
        w = _url_or_error(state.registry.add, url)
        if isinstance(w, Response):
            return w
        await state.registry.check(state.client, w.url)
        return {"added": w.url, "healthy": w.healthy, "verified": w.verified, "note": w.note}

    @app.post("/remove_worker")
    async def remove_worker(url: str):
        removed = _url_or_error(state.registry.remove, url)
        if isinstance(removed, Response):
            return removed
        if not removed:
            return error_json(404, f"no worker {url}", param="url")
        state.sessions.forget_worker(normalize_url(url))
        return {"removed": normalize_url(url)}

    @app.get("/metrics")
    async def metrics():
        # The workers' own prompt/cached token counts: the hit rate that matters is theirs.
        infos = await broadcast(state, "GET", "/get_server_info", timeout=state.args.health.timeout)
        state.worker_cache = {
            u: r["body"]["internal_state"]
            for u, r in infos.items()
            if r.get("status") == 200
            and isinstance(r.get("body"), dict)
            and isinstance(r["body"].get("internal_state"), dict)
        }
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    return app


def _url_or_error(op, url: str):
    """op(url), or a 400 naming the `url` parameter when it is not an http(s) URL (403 when
    --worker-allowlist does not name its host)."""
    try:
        return op(url)
    except WorkerNotAllowed as e:
        return error_json(403, str(e), "permission_error", param="url")
    except ValueError as e:
        return error_json(400, str(e), param="url")


def router_info(state: RouterState) -> dict:
    rs = sorted(state.route_seconds)
    return {
        "policy": state.policy.name,
        "workers": [w.as_dict() for w in state.registry.workers.values()],
        "decisions": getattr(state.policy, "decisions", {}),
        "route_ms_p50": round(1e3 * rs[len(rs) // 2], 4) if rs else None,
        # --kv-events: per worker its publisher and what the router's view of it holds
        "kv_events": state.kv.stats() if state.kv is not None else None,
        "kv_events_hits": getattr(state.policy, "kv_events_hits", 0),
    }


async def _maintain(state: RouterState) -> None:
    while True:
        await asyncio.sleep(1.0)
        state.policy.maintain()
