"""The PD router: `radixlm router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL`
(SGLang router's flags and flow; docs/disaggregation.md).

A generation request (native /generate, OpenAI completions and chat) goes to a (prefill, decode)
pair the two policies pick (--prefill-policy, --decode-policy; default --policy), with SGLang's
`bootstrap_host`, `bootstrap_port` (the prefill server's bootstrap service) and a random
`bootstrap_room` added, sent to both at once. The decode server's answer (whole, or its stream)
is the client's: it carries the first token, its logprobs and the prompt logprobs the prefill
computed (they come with the KV's aux record, so a stream needs no merging here).

Failures: a pair whose prefill or decode server cannot be connected to (the request never
started) is retried once on another pair; any other failure is a 5xx (the prefill's own 4xx, a
request it refused, is returned as it is), never a hang: both servers time their transfers out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.http_access import AccessConfig, AccessMiddleware, Refusal, install_access
from radixlm.http_common import error_json
from radixlm.router.policies import make_policy
from radixlm.router.proxy import HOP_HEADERS, read_body, request_headers
from radixlm.router.routing_text import routing_text
from radixlm.router.server import GENERATE_PATHS
from radixlm.router.state import RouterArgs
from radixlm.router.workers import WorkerRegistry

logger = logging.getLogger(__name__)
DEFAULT_BOOTSTRAP_PORT = 8998  # a prefill server's --disaggregation-bootstrap-port default


class PDRouterState:
    def __init__(self, args: RouterArgs):
        self.args = args
        self.prefill_policy = make_policy(args.prefill_policy or args.policy, args.cache_aware)
        self.decode_policy = make_policy(args.decode_policy or args.policy, args.cache_aware)
        headers = {"Authorization": f"Bearer {args.worker_api_key}"} if args.worker_api_key else {}
        self.headers = headers
        allow = tuple(args.worker_allowlist)
        self.prefill = WorkerRegistry(
            args.health, headers, on_unhealthy=self.prefill_policy.remove_worker, allowlist=allow
        )
        self.decode = WorkerRegistry(
            args.health, headers, on_unhealthy=self.decode_policy.remove_worker, allowlist=allow
        )
        self.bootstrap_ports: dict[str, int] = {}
        for url, port in args.prefill_urls:
            self.bootstrap_ports[self.prefill.add(url).url] = port or DEFAULT_BOOTSTRAP_PORT
        for url in args.decode_urls:
            self.decode.add(url)
        self.client: httpx.AsyncClient | None = None
        self.registry = self.decode  # proxy.request_headers adds its workers' key
        self.pairs_routed = 0
        self.retries = 0

    def pick_pair(self, text: str, tried: set[tuple[str, str]]) -> tuple[str, str] | None:
        """The policies' pair; one not tried yet when the pools have one."""
        ps, ds = self.prefill.healthy(), self.decode.healthy()
        if not ps or not ds:
            return None
        pair = (
            self.prefill_policy.select(ps, self.prefill.loads(), text),
            self.decode_policy.select(ds, self.decode.loads(), text),
        )
        if pair in tried:
            fresh = [(p, d) for p in ps for d in ds if (p, d) not in tried]
            if not fresh:
                return None
            pair = fresh[0]
        return pair

    def registries(self) -> tuple[WorkerRegistry, WorkerRegistry]:
        return self.prefill, self.decode


def _refusal(body) -> Response | None:
    """What the PD flow cannot route (one transfer room per request): a 400 naming the field."""
    if not isinstance(body, dict):
        return error_json(400, "the request body must be a JSON object")
    for key in ("text", "input_ids", "prompt"):
        v = body.get(key)
        if isinstance(v, list) and v and (isinstance(v[0], (list, str))):
            return error_json(
                400,
                f"{key}: a batch is not routed with --pd-disaggregation (send one prompt per "
                "request)",
                param=key,
            )
    sp = body.get("sampling_params")
    n = body.get("n", sp.get("n") if isinstance(sp, dict) else None)
    if n not in (None, 1):
        return error_json(400, "n: one completion per request with --pd-disaggregation", param="n")
    if body.get("session_params"):
        return error_json(
            400,
            "session_params: sessions are not routed with --pd-disaggregation",
            param="session_params",
        )
    return None


async def pd_forward(
    state: PDRouterState, request: Request, path: str, raw: bytes, body
) -> Response:
    refused = _refusal(body)
    if refused is not None:
        return refused
    headers = _request_headers_pd(state, request)
    text, tried = routing_text(path, body), set()
    last = "no healthy prefill and decode pair"
    for attempt in range(2):
        pair = state.pick_pair(text, tried)
        if pair is None:
            break
        tried.add(pair)
        prefill, decode = pair
        room = random.getrandbits(63)
        payload = json.dumps(
            {
                **body,
                "bootstrap_host": urlsplit(prefill).hostname,
                "bootstrap_port": state.bootstrap_ports[prefill],
                "bootstrap_room": room,
            }
        ).encode()
        state.pairs_routed += 1
        outcome = await _send_pair(state, prefill, decode, path, payload, headers)
        if isinstance(outcome, str):  # never started: another pair
            last = outcome
            state.retries += attempt == 0
            logger.warning(
                "PD pair (%s, %s) failed before starting (%s)%s",
                prefill,
                decode,
                outcome,
                "; retrying on another pair" if attempt == 0 else "",
            )
            continue
        return outcome
    return error_json(
        503, f"no prefill/decode pair could serve the request ({last})", "server_error"
    )


async def _send_pair(
    state: PDRouterState, prefill: str, decode: str, path: str, payload: bytes, headers: dict
):
    """The decode server's answer as a Response, or a string: why the pair never started."""
    client = state.client
    pw, dw = state.prefill.workers[prefill], state.decode.workers[decode]
    pw.load += 1
    dw.load += 1
    pre = asyncio.ensure_future(client.post(prefill + path, content=payload, headers=headers))
    pre.add_done_callback(lambda t: _prefill_done(state, prefill, t))
    dec = asyncio.ensure_future(
        client.send(
            client.build_request("POST", decode + path, content=payload, headers=headers),
            stream=True,
        )
    )
    while not dec.done():
        await asyncio.wait({pre, dec}, return_when=asyncio.FIRST_COMPLETED)
        if dec.done() or not pre.done():
            continue
        error = pre.exception()
        if error is None and pre.result().status_code < 400:
            # the prefill finished (the decode side acknowledged its KV): the decode answers
            continue
        dec.cancel()  # closes the decode connection: the decode server aborts the request
        dw.load -= 1
        if isinstance(error, httpx.ConnectError):
            state.prefill.record(prefill, False)
            return f"prefill {prefill}: {error}"
        if error is not None:
            return error_json(
                502, f"prefill {prefill}: {type(error).__name__}: {error}", "server_error"
            )
        r = pre.result()  # its own refusal (4xx) as it is; a failure as a 502
        if r.status_code < 500:
            return Response(
                r.content, status_code=r.status_code, media_type=r.headers.get("content-type")
            )
        return error_json(
            502, f"prefill {prefill} answered {r.status_code}: {r.text[:500]}", "server_error"
        )
    try:
        resp = dec.result()
    except httpx.ConnectError as e:
        dw.load -= 1
        pre.cancel()
        state.decode.record(decode, False)
        return f"decode {decode}: {e}"
    except httpx.HTTPError as e:
        dw.load -= 1
        return error_json(502, f"decode {decode}: {type(e).__name__}: {e}", "server_error")
    state.decode.record(decode, resp.status_code < 500)
    out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
    if resp.status_code >= 500:  # the transfer failed: a 502 naming the decode server's message
        data = await resp.aread()
        await resp.aclose()
        dw.load -= 1
        return error_json(
            502,
            f"decode {decode} answered {resp.status_code}: {data[:500].decode(errors='replace')}",
            "server_error",
        )
    return StreamingResponse(_relay(resp, dw), status_code=resp.status_code, headers=out_headers)


def _prefill_done(state: PDRouterState, url: str, task: asyncio.Future) -> None:
    if url in state.prefill.workers:
        state.prefill.workers[url].load -= 1
    if not task.cancelled() and task.exception() is not None:
        logger.info("prefill %s: %s", url, task.exception())


async def _relay(resp: httpx.Response, worker):
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    finally:
        worker.load -= 1
        await resp.aclose()


def _request_headers_pd(state: PDRouterState, request: Request) -> dict:
    h = request_headers(state, request)  # the client's headers, the workers' key
    h["content-type"] = "application/json"
    return h


def create_pd_router_app(args: RouterArgs) -> FastAPI:
    state = PDRouterState(args)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.client = httpx.AsyncClient(
            timeout=httpx.Timeout(args.request_timeout, connect=args.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        for reg in state.registries():
            await reg.check_all(state.client)
        tasks = [
            asyncio.ensure_future(reg.run_health_checks(state.client)) for reg in state.registries()
        ]
        yield
        for t in tasks:
            t.cancel()
        await state.client.aclose()

    app = FastAPI(title="radixlm PD router", lifespan=lifespan)
    app.state.router = state
    app.add_middleware(AccessMiddleware, admin_paths=("/flush_cache",))
    install_access(
        app, AccessConfig(args.api_key, args.admin_api_key, args.host, tuple(args.allowed_origins))
    )

    @app.exception_handler(Refusal)
    async def _refused(request: Request, e: Refusal):
        return error_json(e.status, e.message, e.kind, e.param)

    for path in GENERATE_PATHS:

        async def generate(request: Request, path=path):
            raw, body = await read_body(request, args.max_request_body_bytes)
            return await pd_forward(state, request, path, raw, body)

        app.add_api_route(path, generate, methods=["POST"])

    @app.get("/health")
    async def health():
        ok = bool(state.prefill.healthy() and state.decode.healthy())
        return JSONResponse(
            {
                "healthy_prefill": len(state.prefill.healthy()),
                "healthy_decode": len(state.decode.healthy()),
            },
            status_code=200 if ok else 503,
        )

    @app.get("/v1/models")
    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info(request: Request):
        for url in state.decode.healthy():
            try:
                r = await state.client.get(
                    url + request.url.path, headers=state.headers, timeout=10.0
                )
            except httpx.HTTPError:
                continue
            return Response(
                r.content, status_code=r.status_code, media_type=r.headers.get("content-type")
            )
        return error_json(503, "no healthy decode server", "server_error")

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info():
        out = {
            "router": {
                "pd_disaggregation": True,
                "pairs_routed": state.pairs_routed,
                "retries": state.retries,
                "prefill": [w.as_dict() for w in state.prefill.workers.values()],
                "decode": [w.as_dict() for w in state.decode.workers.values()],
            }
        }
        for role, reg in (("prefill", state.prefill), ("decode", state.decode)):
            out[role] = {u: await _get_json(state, u + "/get_server_info") for u in reg.verified()}
        return out

    @app.post("/flush_cache")
    async def flush_cache():
        admin = (
            {"Authorization": f"Bearer {args.worker_admin_api_key}"}
            if args.worker_admin_api_key
            else state.headers
        )
        results = {}
        for reg in state.registries():
            for u in reg.verified():
                try:
                    r = await state.client.post(u + "/flush_cache", headers=admin, timeout=30.0)
                    results[u] = {"status": r.status_code}
                except httpx.HTTPError as e:
                    results[u] = {"status": 502, "error": f"{type(e).__name__}: {e}"}
        ok = all(r["status"] < 300 for r in results.values())
        return JSONResponse({"workers": results}, status_code=200 if ok else 502)

    return app


async def _get_json(state: PDRouterState, url: str):
    try:
        r = await state.client.get(url, headers=state.headers, timeout=10.0)
        return r.json()
    except (httpx.HTTPError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
