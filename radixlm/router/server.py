"""The router's HTTP server: one endpoint in front of the workers (FastAPI + uvicorn, httpx).

Generation routes (native /generate, OpenAI completions and chat) go to the worker the policy
picks and come back byte for byte, streams chunk by chunk; a client that goes away closes the
worker connection, which aborts the request there. A request whose worker fails before answering
(connection refused or reset, a 5xx status) is retried on another worker with backoff: nothing has
reached the client yet, so it never sees the failure. /flush_cache and /abort_request go to every
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
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.http_access import (
    AccessConfig,
    AccessMiddleware,
    Refusal,
    abort_target,
    install_access,
    json_content_type_error,
    presented_key,
)
from radixlm.http_common import error_json, read_bounded
from radixlm.http_dashboard import OPEN_PATHS as DASHBOARD_OPEN_PATHS
from radixlm.router.affinity import SessionAffinity, client_owner, session_id_of
from radixlm.router.dashboard import router_dashboard
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policies import CacheAwareConfig, Policy, make_policy
from radixlm.router.routing_text import routing_text
from radixlm.router.workers import HealthConfig, WorkerNotAllowed, WorkerRegistry, normalize_url

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
_HOP_HEADERS = {
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
}
# A browser's headers stay here: a worker would take them for a cross-origin call of its own.
_BROWSER_HEADERS = {
    "origin",
    "referer",
    "cookie",
    "sec-fetch-site",
    "sec-fetch-mode",
    "sec-fetch-dest",
    "sec-fetch-user",
}
ADMIN_PATHS = ("/add_worker", "/remove_worker", "/flush_cache")


@dataclass
class RouterArgs:
    worker_urls: list[str] = field(default_factory=list)
    policy: str = "cache_aware"
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # clients must send it (every route but /health)
    worker_api_key: str | None = None  # sent to the verified workers
    admin_api_key: str | None = None  # the operator's: the admin routes need it
    worker_admin_api_key: str | None = (
        None  # sent to the workers for admin actions (flush, abort all)
    )
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to call the router; "*": any
    worker_allowlist: tuple[
        str, ...
    ] = ()  # host patterns (fnmatch) a worker URL must match; empty: any
    max_request_body_bytes: int = 32 * 2**20  # a larger request body is a 413
    connect_timeout: float = 5.0  # seconds to connect to a worker
    request_timeout: float = 1800.0  # seconds a worker may stay silent (no byte) on a request
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    max_retries: int = 3  # other workers tried for a request whose worker failed before answering
    retry_backoff: float = 0.05  # seconds before the first retry, doubled for each further one
    log_level: str = "info"
    # PD disaggregation (router/pd.py): prefill servers (url, bootstrap port or None) and decode
    # servers.
    pd_disaggregation: bool = False
    prefill_urls: list = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)
    prefill_policy: str | None = None  # None: --policy
    decode_policy: str | None = None


class RouterState:
    def __init__(self, args: RouterArgs, policy: Policy | None = None):
        self.args = args
        self.policy = policy or make_policy(args.policy, args.cache_aware)
        headers = {"Authorization": f"Bearer {args.worker_api_key}"} if args.worker_api_key else {}
        self.registry = WorkerRegistry(
            args.health,
            headers,
            on_unhealthy=self.policy.remove_worker,
            allowlist=tuple(args.worker_allowlist),
        )
        self.admin_headers = (
            {"Authorization": f"Bearer {args.worker_admin_api_key}"}
            if args.worker_admin_api_key
            else headers
        )
        for url in args.worker_urls:
            self.registry.add(url)
        self.client: httpx.AsyncClient | None = None
        self.route_seconds: deque[float] = deque(
            maxlen=1000
        )  # the policy's time per routed request
        self.worker_cache: dict[
            str, dict
        ] = {}  # each worker's internal state at the last /metrics scrape
        self.metrics = RouterMetrics(self)
        self.sessions = SessionAffinity()

    def pick(self, text: str) -> str | None:
        workers = self.registry.healthy()
        if not workers:
            return None
        t = time.perf_counter()
        url = self.policy.select(workers, self.registry.loads(), text)
        self.route_seconds.append(time.perf_counter() - t)
        return url


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
        yield
        for t in tasks:
            t.cancel()
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
                return await forward(state, request, path, raw, routing_text(path, body))
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


async def read_body(request: Request, limit: int) -> tuple[bytes, object]:
    """The body (raw, parsed): JSON as application/json, at most `limit` bytes (on Content-Length
    before reading, and while reading a chunked one), else a Refusal (415, 413, 400)."""
    problem = json_content_type_error(request.headers.get("content-type"))
    if problem:
        raise Refusal(415, problem, "content-type")
    too_big = Refusal(
        413,
        f"the request body is larger than the limit of {limit} bytes (--max-request-body-bytes)",
        "body",
    )
    raw = await read_bounded(request, limit, too_big)
    try:
        return raw, json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; too deep
        raise Refusal(400, f"malformed JSON body: {str(e)[:200] or type(e).__name__}") from None


def router_info(state: RouterState) -> dict:
    rs = sorted(state.route_seconds)
    return {
        "policy": state.policy.name,
        "workers": [w.as_dict() for w in state.registry.workers.values()],
        "decisions": getattr(state.policy, "decisions", {}),
        "route_ms_p50": round(1e3 * rs[len(rs) // 2], 4) if rs else None,
    }


async def _maintain(state: RouterState) -> None:
    while True:
        await asyncio.sleep(1.0)
        state.policy.maintain()


def _request_headers(state: RouterState, request: Request) -> dict:
    h = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in _HOP_HEADERS | _BROWSER_HEADERS | {"host", "authorization", "x-api-key"}
    }
    h.update(state.registry.headers)
    return h


async def forward(
    state: RouterState,
    request: Request,
    path: str,
    raw: bytes,
    text: str,
    pinned: str | None = None,
) -> Response:
    """Send the request to a picked worker; on a failure before any answer, to another one. A
    `pinned` request (a session's turn) goes to that worker only: its state lives nowhere else."""
    headers = _request_headers(state, request)
    tried: set[str] = set()
    last_error = (
        "no healthy worker" if pinned is None else f"the session's worker {pinned} is not healthy"
    )
    for attempt in range(1 if pinned else state.args.max_retries + 1):
        if attempt:
            await asyncio.sleep(state.args.retry_backoff * 2 ** (attempt - 1))
        url = (
            state.pick(text)
            if pinned is None
            else pinned
            if pinned in state.registry.healthy()
            else None
        )
        if url is None:
            break
        if url in tried and len(state.registry.healthy()) > len(tried):  # prefer one not tried yet
            url = next(u for u in state.registry.healthy() if u not in tried)
        tried.add(url)
        worker = state.registry.workers[url]
        worker.load += 1
        worker.routed += 1

        def failed(why: str) -> str:
            worker.load -= 1
            worker.errors += 1
            state.registry.record(url, False)
            logger.warning("request to %s failed (%s); retrying elsewhere", url, why)
            return f"worker {url}: {why}"

        try:
            resp = await state.client.send(
                state.client.build_request("POST", url + path, content=raw, headers=headers),
                stream=True,
            )
        except httpx.HTTPError as e:
            last_error = failed(f"{type(e).__name__}: {e}")
            continue
        if resp.status_code >= 500:
            await resp.aclose()
            last_error = failed(f"answered {resp.status_code}")
            continue
        # Nothing is sent to the client before the worker's first body bytes: a worker that dies
        # between its headers and its first chunk (a stream's headers go out before any token)
        # is a failure before any answer, retried elsewhere like a refused connection.
        chunks = resp.aiter_raw()
        try:
            first = await anext(chunks, b"")
        except httpx.HTTPError as e:
            await resp.aclose()
            last_error = failed(f"{type(e).__name__} before its first bytes: {e}")
            continue
        state.registry.record(url, True)
        return StreamingResponse(
            _relay(resp, first, chunks, worker),
            status_code=resp.status_code,
            headers={k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS},
        )
    return error_json(503, f"no worker could serve the request ({last_error})", "server_error")


async def forward_once(
    state: RouterState, request: Request, url: str, path: str, raw: bytes
) -> Response:
    """One small request to one worker, answered whole (a 502 when it cannot be reached)."""
    try:
        r = await state.client.post(
            url + path, content=raw, headers=_request_headers(state, request)
        )
    except httpx.HTTPError as e:
        state.registry.record(url, False)
        return error_json(502, f"worker {url}: {type(e).__name__}: {e}", "server_error")
    return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))


async def _relay(resp: httpx.Response, first: bytes, chunks, worker):
    """The worker's bytes as they come; closing (client gone, or done) closes the worker's
    connection, which aborts the request there if it is still running."""
    try:
        if first:
            yield first
        async for chunk in chunks:
            yield chunk
    finally:
        worker.load -= 1
        await resp.aclose()


async def forward_get(state: RouterState, path: str) -> Response:
    for url in state.registry.healthy():
        try:
            r = await state.client.get(url + path, headers=state.registry.headers, timeout=10.0)
        except httpx.HTTPError:
            state.registry.record(url, False)
            continue
        return Response(
            r.content, status_code=r.status_code, media_type=r.headers.get("content-type")
        )
    return error_json(503, "no healthy worker", "server_error")


async def broadcast(
    state: RouterState,
    method: str,
    path: str,
    content: bytes = b"",
    timeout: float = 30.0,
    headers: dict | None = None,
) -> dict:
    """`method path` on every verified worker, with `headers` (default: the workers' user key)."""
    headers = {
        **(state.registry.headers if headers is None else headers),
        **({"Content-Type": "application/json"} if content else {}),
    }

    async def one(url: str) -> dict:
        try:
            r = await state.client.request(
                method, url + path, content=content or None, headers=headers, timeout=timeout
            )
            try:
                body = r.json()
            except ValueError:
                body = r.text
            return {"status": r.status_code, "body": body}
        except httpx.HTTPError as e:
            return {"status": 502, "error": f"{type(e).__name__}: {e}"}

    urls = state.registry.verified()
    return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls))))
