"""The router's /dashboard: every worker side by side (health, load, running and waiting requests,
throughput, KV usage, cache hit rate). /dashboard/stream sends one Server-Sent Event per
`interval` while the page is open, from each verified worker's /get_server_info gathered at that
moment (nothing is polled with nobody watching); the page (http_dashboard.py: router.html) turns
the workers' running totals into rates."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from radixlm.http_common import error_json
from radixlm.http_dashboard import dashboard_pages

MIN_INTERVAL, MAX_INTERVAL = 0.2, 60.0
# What the page shows of a worker's internal state.
_STATE_FIELDS = (
    "num_running",
    "num_waiting",
    "num_retracted",
    "max_total_num_tokens",
    "available_kv_tokens",
    "evictable_tokens",
    "cache_hit_rate",
    "generated_tokens",
    "prompt_tokens",
    "gen_throughput",
)


def worker_view(worker: dict, info: dict | None) -> dict:
    """One worker's card: the registry's view of it, plus its state when it answered."""
    out = {**worker, "state": None, "error": None}
    if info is None:
        return out
    body = info.get("body")
    if (
        info.get("status") == 200
        and isinstance(body, dict)
        and isinstance(body.get("internal_state"), dict)
    ):
        st = body["internal_state"]
        out["state"] = {k: st.get(k) for k in _STATE_FIELDS}
        out["model"] = body.get("served_model_name") or body.get("model_path")
    else:
        out["error"] = info.get("error") or f"status {info.get('status')}"
    return out


def router_dashboard(
    workers: Callable[[], list[dict]], gather: Callable[[], Awaitable[dict[str, dict]]]
) -> APIRouter:
    """workers(): the registry's workers (as_dict); gather(): url -> {status, body} of each verified
    worker's /get_server_info."""
    router = APIRouter()
    router.include_router(dashboard_pages("router.html"))

    # Out of the OpenAPI document, as the page: an endless stream for a page, not an API to generate
    # calls for.
    @router.get("/dashboard/stream", include_in_schema=False)
    async def dashboard_stream(request: Request):
        raw = request.query_params.get("interval", "1")
        try:
            interval = float(raw)
        except ValueError:
            interval = math.nan
        if not (MIN_INTERVAL <= interval <= MAX_INTERVAL):
            return error_json(
                400,
                f"interval must be a number from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}, "
                f"got {raw[:50]!r}",
                param="interval",
            )
        return StreamingResponse(
            _ticks(request, interval),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _ticks(request: Request, interval: float) -> AsyncIterator[bytes]:
        while not await request.is_disconnected():
            infos = await gather()
            event = {
                "t": time.time(),
                "workers": [worker_view(w, infos.get(w["url"])) for w in workers()],
            }
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
            await asyncio.sleep(interval)

    return router
