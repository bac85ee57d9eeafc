"""GET /dashboard (the page, http_dashboard.py) and /dashboard/stream: Server-Sent Events, one
every `interval` seconds while the client stays connected (rates, latency percentiles, the
scheduler's gauges, recent requests, the radix tree's largest shared prefixes; dashboard_feed.py).
Each tick is one DashboardSnapshotReq to the scheduler; with no client connected nothing is sent,
so the scheduler pays nothing. Behind --api-key like every route (the page sends the key as
Bearer). Token text and prompt heads only with --dashboard-show-text."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from radixlm.engine.tokenizer_manager import EngineDeadError
from radixlm.http_dashboard import dashboard_pages
from radixlm.ipc import DashboardSnapshotReq, DashboardSnapshotReqOutput
from radixlm.server.api_common import HTTPError, ServerState, served_model_name, srv, sse
from radixlm.server.dashboard_feed import FeedRates, build_event

logger = logging.getLogger(__name__)

router = APIRouter()
router.include_router(dashboard_pages("server.html"))

MIN_INTERVAL, MAX_INTERVAL = 0.2, 60.0
MAX_NODES = 512


def _number(
    request: Request, name: str, default: float, lo: float, hi: float, integer: bool = False
) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        v = int(raw) if integer else float(raw)
    except ValueError:
        v = math.nan
    if not (lo <= v <= hi):
        kind = "an integer" if integer else "a number"
        raise HTTPError(
            400, f"{name} must be {kind} from {lo:g} to {hi:g}, got {raw[:50]!r}", param=name
        )
    return v


# Out of the OpenAPI document, as the page: an endless stream for a page, not an API to generate
# calls for.
@router.get("/dashboard/stream", include_in_schema=False)
async def dashboard_stream(request: Request):
    interval = _number(request, "interval", 1.0, MIN_INTERVAL, MAX_INTERVAL)
    max_nodes = int(_number(request, "max_nodes", 64, 0, MAX_NODES, integer=True))
    state = srv(request)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        _ticks(request, state, interval, max_nodes), media_type="text/event-stream", headers=headers
    )


async def _ticks(
    request: Request, state: ServerState, interval: float, max_nodes: int
) -> AsyncIterator[bytes]:
    rates = FeedRates()
    show_text = state.server_args.dashboard_show_text
    model = served_model_name(state.server_args, state.scheduler_info)
    while not await request.is_disconnected():
        tm = state.tokenizer_manager  # the current engine's (--restart-on-failure swaps it)
        try:
            snap = await tm.control.call(
                DashboardSnapshotReq(max_nodes, show_text), DashboardSnapshotReqOutput
            )
            recent = tm.observability.recent
            decode = tm.tokenizer.decode if show_text else None
            yield sse(
                build_event(
                    snap, recent.latest(recent.items.maxlen), recent.finished, rates, model, decode
                )
            )
        except EngineDeadError as e:  # the page says so and keeps listening (a restart may follow)
            yield sse({"error": {"message": str(e), "type": "engine_dead", "code": 503}})
        except Exception as e:
            logger.exception("dashboard tick failed")
            yield sse(
                {
                    "error": {
                        "message": f"internal error: {type(e).__name__}",
                        "type": "internal_error",
                        "code": 500,
                    }
                }
            )
        await asyncio.sleep(interval)
