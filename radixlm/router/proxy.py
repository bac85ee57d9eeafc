"""How the router reaches its workers: a request forwarded to the worker the policy picks and its
answer relayed byte for byte, streams chunk by chunk (a client that goes away closes the worker
connection, which aborts the request there); a request whose worker fails before answering
(connection refused or reset, a 5xx status, nothing before its first bytes) retried on another
worker with backoff, so the client never sees the failure; one call answered whole; one call to
every verified worker (broadcast). Bodies are read within --max-request-body-bytes and the
client's own headers (its key, a browser's) stay in the router."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.http_access import Refusal, json_content_type_error
from radixlm.http_common import error_json, read_bounded
from radixlm.router.state import RouterState

logger = logging.getLogger(__name__)

HOP_HEADERS = {
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
}
# A browser's headers stay here: a worker would take them for a cross-origin call of its own.
BROWSER_HEADERS = {
    "origin",
    "referer",
    "cookie",
    "sec-fetch-site",
    "sec-fetch-mode",
    "sec-fetch-dest",
    "sec-fetch-user",
}


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


def request_headers(state: RouterState, request: Request) -> dict:
    h = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in HOP_HEADERS | BROWSER_HEADERS | {"host", "authorization", "x-api-key"}
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
    tokens: list[int] | None = None,
) -> Response:
    """Send the request to a picked worker; on a failure before any answer, to another one. A
    `pinned` request (a session's turn) goes to that worker only: its state lives nowhere else."""
    headers = request_headers(state, request)
    tried: set[str] = set()
    last_error = (
        "no healthy worker" if pinned is None else f"the session's worker {pinned} is not healthy"
    )
    for attempt in range(1 if pinned else state.args.max_retries + 1):
        if attempt:
            await asyncio.sleep(state.args.retry_backoff * 2 ** (attempt - 1))
        url = (
            state.pick(text, tokens)
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
            headers={k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS},
        )
    return error_json(503, f"no worker could serve the request ({last_error})", "server_error")


async def forward_once(
    state: RouterState, request: Request, url: str, path: str, raw: bytes
) -> Response:
    """One small request to one worker, answered whole (a 502 when it cannot be reached)."""
    try:
        r = await state.client.post(
            url + path, content=raw, headers=request_headers(state, request)
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
