"""DecodeManager: the decode step of every running request, and what makes room for it.

Aborted running requests finish before their next step takes a KV slot; when the pool cannot give
every running request one more slot, retraction requeues requests (they re-prefill later, mostly
from the cache). Speculative decoding (decoding/spec_decoding.py) may turn the step into a verify
step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radixlm.model.forward_batch import ForwardMode
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.batching.admission import NewTokenRatio
from radixlm.scheduler.decoding.spec_decoding import BaseSpeculation
from radixlm.scheduler.execution.overlap import can_overlap
from radixlm.scheduler.invariants import InvariantError
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.output.finisher import Finisher
from radixlm.scheduler.req import ReqStatus
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


class DecodeManager:
    def __init__(
        self,
        queues: ReqQueues,
        cache_manager: CacheManager,
        finisher: Finisher,
        spec: BaseSpeculation,
        ratio: NewTokenRatio,
        stats: SchedulerStats,
        context_len: int,
        steps_in_flight: Callable[[], bool],
    ):
        self.queues = queues
        self.cache_manager = cache_manager
        self.finisher = finisher
        self.spec = spec
        self.ratio = ratio
        self.stats = stats
        self.context_len = context_len
        self.steps_in_flight = steps_in_flight

    def schedule(self) -> ScheduleBatch | None:
        """The decode (or verify) step of the running requests, or None when none runs."""
        self.finish_aborted()
        running = self.queues.running
        if not running:
            return None
        if self.cache_manager.kv_room() < len(running):
            self.retract()
        else:
            self.ratio.step()
        if not running:
            return None
        return self.spec.decode_batch(
            running, self.cache_manager.kv_room() - len(running), self.context_len
        )

    def schedule_overlapped(self) -> ScheduleBatch | None:
        """The next decode step built while the previous one is still in flight (overlap.py), or
        None when it needs that step's tokens first (or a retraction)."""
        running = self.queues.running
        if (
            not running
            or not can_overlap(running, self.context_len)
            or self.cache_manager.kv_room() < len(running)
        ):
            return None
        self.ratio.step()
        return ScheduleBatch(ForwardMode.DECODE, decode_reqs=list(running))

    def mix_with_running(self, prefill: ScheduleBatch) -> ScheduleBatch:
        """--enable-mixed-chunk: prefill plus a decode step of every running request, when the pool
        has a slot for each (else the prefill alone; the decode step follows as usual)."""
        self.finish_aborted()
        running = self.queues.running
        if not running:
            return prefill
        need = sum(c.length for c in prefill.chunks) + len(running)
        if self.cache_manager.kv_room() < need:
            return prefill
        self.ratio.step()
        return ScheduleBatch(ForwardMode.MIXED, chunks=prefill.chunks, decode_reqs=list(running))

    def finish_aborted(self) -> None:
        """Aborted running requests finish before their next step takes a KV slot."""
        for r in [r for r in self.queues.running if r.to_abort]:
            r.abort()
            self.finisher.finish(r)

    def retract(self) -> None:
        """Out of KV for one more decode step. Requeue, in this order, the request being prefilled
        in chunks, then running requests (fewest outputs first) until the rest fit; they resume
        later by re-prefilling prompt + outputs (mostly from the cache). Never all of them: the
        last one always fits unless it alone outgrows the pool."""
        assert not self.steps_in_flight(), "retraction needs every step processed"
        cm, q = self.cache_manager, self.queues
        retracted = []
        if q.prefilling and cm.kv_room() < len(q.running):
            retracted += q.prefilling
        order = sorted(
            q.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True
        )
        for req in retracted:
            cm.release(req)
        while len(order) > 1 and cm.kv_room() < len(order):
            req = order.pop()
            cm.release(req)
            retracted.append(req)
        for req in retracted:
            req.retracted += 1
        q.move_all(retracted, ReqStatus.WAITING, front=True)
        self.ratio.after_retraction()
        self.stats.num_retracted += len(retracted)
        logger.warning(
            "KV cache full: retracted %d request(s); %d keep running",
            len(retracted),
            len(q.running),
        )
        if cm.kv_room() < len(q.running):
            (req,) = q.running
            pool_size = cm.token_to_kv_pool.size
            if req.seqlen + 1 <= pool_size:
                raise InvariantError(
                    f"a lone request ({req.seqlen} tokens) finds no KV slot in a pool of "
                    f"{pool_size}: something else holds KV"
                )
            req.abort("out of KV cache memory")
            self.finisher.finish(req)
