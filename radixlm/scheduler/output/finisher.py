"""Finisher: the end of a request, wherever it is in its lifecycle.

It leaves its queue; its KV goes to the tree or the free list — after the step in flight, if that
step still reads it (FINISHING), else at once (FINISHED); speculative decoding forgets it; its last
chunk goes out.
"""

from __future__ import annotations

import logging
from typing import Protocol

from radixlm.scheduler.decoding.spec_decoding import BaseSpeculation
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.kv.session_pins import BaseSessionPins, NoSessionPins
from radixlm.scheduler.output.output_streamer import OutputStreamer
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues

logger = logging.getLogger(__name__)


class StepsInFlight(Protocol):
    def holds(self, req: Req) -> bool:
        """Whether a launched, unprocessed step still reads req's KV."""

    def defer_release(self, req: Req) -> None:
        """Release req's KV once that step is processed."""


class Finisher:
    def __init__(
        self,
        queues: ReqQueues,
        cache_manager: CacheManager,
        in_flight: StepsInFlight,
        spec: BaseSpeculation,
        outputs: OutputStreamer,
        sessions: BaseSessionPins | None = None,
    ):
        self.queues = queues
        self.sessions = sessions or NoSessionPins()  # a session's turn pins its KV on release
        self.cache_manager = cache_manager
        self.in_flight = in_flight
        self.spec = spec
        self.outputs = outputs

    def finish(self, req: Req) -> None:
        """req is finished (its finished_reason set)."""
        self.spec.release(req)
        if self.in_flight.holds(req):
            self.queues.move(req, ReqStatus.FINISHING)
            self.in_flight.defer_release(req)
        else:
            self.sessions.before_release(req)
            self.cache_manager.release(req)
            self.queues.move(req, ReqStatus.FINISHED)
        self.outputs.emit(req)

    def release(self, req: Req) -> None:
        """A FINISHING request's step completed: its KV goes now."""
        self.sessions.before_release(req)
        self.cache_manager.release(req)
        self.queues.move(req, ReqStatus.FINISHED)

    def fail(self, req: Req, exc: BaseException) -> None:
        """req's own processing raised: it finishes with an internal error (500); the others go
        on."""
        logger.exception("request %s failed", req.rid, exc_info=exc)
        req.finished_reason = None  # whatever it was about to finish with, it failed
        req.abort(f"internal error: {type(exc).__name__}: {exc}", 500)
        if req.status in (ReqStatus.FINISHING, ReqStatus.FINISHED):
            self.outputs.emit(req)  # it failed after it finished: only the news is left to send
        else:
            self.finish(req)
