"""PrefillManager: the next extend batch — which waiting requests (and how much of each) it admits.

The request being prefilled in chunks goes first (its next chunk); then the policy orders the
waiting queue and PrefillAdder (admission.py) admits in that order while the KV budget lasts.
Admitted requests become PREFILLING; a request whose chunk is not its last stays PREFILLING
between steps (at most one at a time). With speculative decoding a request with one prompt token
left to compute may become RUNNING at once instead (prefill_fold.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.lora.runtime import BaseLoRARuntime, NoLoRA
from radixlm.model.forward_batch import ForwardMode
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.batching.admission import (
    NewTokenRatio,
    PrefillAdder,
    reserve_for,
    shares_prefix_in_batch,
)
from radixlm.scheduler.batching.policy import SchedulePolicy, is_cache_aware
from radixlm.scheduler.decoding.prefill_fold import BasePrefillFold, NoPrefillFold
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats


@dataclass(frozen=True)
class PrefillLimits:
    max_running_requests: int
    max_prefill_tokens: int  # new tokens per extend batch
    chunk_size: int | None  # new tokens of one request per step; None: no chunking


class PrefillManager:
    def __init__(
        self,
        queues: ReqQueues,
        cache_manager: CacheManager,
        policy: SchedulePolicy,
        limits: PrefillLimits,
        ratio: NewTokenRatio,
        stats: SchedulerStats,
        lora: BaseLoRARuntime = NoLoRA(),
        fold: BasePrefillFold = NoPrefillFold(),
    ):
        self.queues = queues
        self.cache_manager = cache_manager
        self.policy = policy
        self.limits = limits
        self.ratio = ratio
        self.stats = stats
        self.lora = lora  # which adapters a batch may mix (--max-loras-per-batch)
        self.fold = (
            fold  # speculative decoding: one-token prefills join the decode step (prefill_fold.py)
        )
        shares = cache_manager.tree_cache.capabilities().shares_prefixes
        self.dedup_in_batch = is_cache_aware(policy.policy) and shares

    def schedule(self) -> ScheduleBatch | None:
        """The next extend batch, or None when nothing can be admitted now."""
        q, max_running = self.queues, self.limits.max_running_requests
        chunked = q.prefilling[0] if q.prefilling else None
        if not q.waiting and chunked is None:
            return None
        if len(q.running) >= max_running and chunked is None:
            return None
        cm = self.cache_manager
        reserve = sum(reserve_for(r, self.ratio.value) for r in q.running)
        adder = PrefillAdder(
            cache=cm,
            rem_total_tokens=cm.kv_room() - reserve,
            rem_input_tokens=self.limits.max_prefill_tokens,
            rem_chunk_tokens=self.limits.chunk_size,
            new_token_ratio=self.ratio.value,
            free_req_slots=min(cm.req_to_token_pool.available_size(), max_running - len(q.running)),
            nothing_running=not q.running,
        )
        if chunked is not None and not adder.add_chunked_req(chunked):
            return None  # no room for its next chunk now: it stays between its chunks
        # Order the queue only when some request could be admitted: a cache-aware policy walks the
        # tree for every waiting request.
        if q.waiting and adder.can_admit_more():
            self._admit_waiting(adder)
        if not adder.chunks:
            return None
        for c in adder.chunks:
            r = c.req
            if r.forward_passes == 0:
                r.cached_tokens = c.start
                self.stats.on_prefill(len(r.origin_input_ids), r.cached_tokens)
        chunks, folded = self.fold.split(adder.chunks)
        admitted = [c.req for c in chunks if c.req.status is ReqStatus.WAITING]
        for r in admitted:
            r.prefill_chunks = 0
        q.move_all(admitted, ReqStatus.PREFILLING)
        q.move_all(folded, ReqStatus.RUNNING)  # their last prompt token is the decode step's input
        return ScheduleBatch(ForwardMode.EXTEND, chunks=chunks) if chunks else None

    def _admit_waiting(self, adder: PrefillAdder) -> None:
        max_running = self.limits.max_running_requests
        prefix_len = self.policy.calc_priority(self.queues.waiting)
        adapters = {r.lora_id for r in self.queues.running} | {c.req.lora_id for c in adder.chunks}
        for req in self.queues.waiting:
            if len(adder.chunks) + len(self.queues.running) >= max_running:
                break
            if self.dedup_in_batch and shares_prefix_in_batch(
                req, [c.req for c in adder.chunks], lambda r=req: self._prefix_len(r, prefix_len)
            ):
                continue  # it will hit the cache next round instead of computing the prefix twice
            # Head of the line: no later request passes one whose adapter does not fit, so it runs
            # as soon as the running requests' adapters leave (nobody starves).
            if not self.lora.fits(adapters | {req.lora_id}) or not adder.add_one_req(req):
                break
            adapters.add(req.lora_id)

    def _prefix_len(self, req: Req, known: dict[int, int]) -> int:
        if id(req) not in known:
            known[id(req)] = len(self.cache_manager.peek(req).indices)
        return known[id(req)]
