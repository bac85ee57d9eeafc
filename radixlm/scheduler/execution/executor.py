"""Executors: how a launched batch runs — forward, grammar masks, sampling, draft verification.

BaseExecutor holds the step both run (launch, run_step) and names the hooks each fills in.
InlineExecutor runs it at once on the scheduler thread. OverlapExecutor (--enable-overlap-schedule;
default on GPU) runs it on a worker thread, and a decode step may stay in flight while the scheduler
builds and launches the next one (overlap.py says how the next step names this one's tokens).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from radixlm.model.executor.runner import ModelRunner
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.host_copy import HostCopy
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.decoding.grammar_manager import GrammarManager
from radixlm.scheduler.decoding.spec_decoding import BaseSpeculation
from radixlm.scheduler.execution.overlap import (
    FutureTokenMap,
    LaunchedBatch,
    StepClock,
    StepOutput,
    can_overlap,
)
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req import Req


class BaseExecutor(ABC):
    """A launched batch's step: KV slots, forward, grammar mask, sampling, verification. How it runs
    (here or on a worker thread) and whether a decode step stays in flight are the hooks below,
    every one abstract: an executor says what it does with each."""

    def __init__(
        self,
        runner: ModelRunner,
        cache_manager: CacheManager,
        grammar: GrammarManager,
        spec: BaseSpeculation,
    ):
        self.runner = runner
        self.cache_manager = cache_manager
        self.grammar = grammar
        self.spec = spec

    def launch(self, batch: ScheduleBatch) -> LaunchedBatch:
        """Allocate the step's KV and build its forward here; run it (_submit). A failure past the
        slot allocation is the batch's, reported when its result is read."""
        mwb = batch.prepare(self.cache_manager)
        has_future = self._reads_future(batch)
        slots = self._future_slots(batch)
        launch_time = time.perf_counter()
        try:
            fb = self.runner.prepare(mwb)
            result = self._submit(batch, fb, slots, has_future)
        except Exception as e:
            result = Future()
            result.set_exception(e)
        return LaunchedBatch(batch, mwb, result, slots, launch_time)

    @abstractmethod
    def _reads_future(self, batch: ScheduleBatch) -> bool:
        """Whether some input is a token the step in flight is still sampling."""

    @abstractmethod
    def _future_slots(self, batch: ScheduleBatch) -> list[int] | None:
        """Where this step stores its sampled ids for the next step to read (None: nowhere)."""

    @abstractmethod
    def _submit(
        self, batch: ScheduleBatch, fb: ForwardBatch, slots: list[int] | None, has_future: bool
    ) -> Future:
        """Run run_step (now, or on a worker thread); its StepOutput is the future's result."""

    def run_step(
        self, batch: ScheduleBatch, fb: ForwardBatch, slots: list[int] | None, has_future: bool
    ) -> StepOutput:
        clock = StepClock(self.runner.device)
        self._resolve_inputs(fb, has_future)
        out = self.runner.forward(fb)
        logits, errors = self.grammar.mask(batch, out.next_token_logits)
        next_ids = self.runner.sample(fb, logits)
        self._store_outputs(slots, next_ids)
        # Not read back here: on CUDA the worker queues the next step while this one runs.
        res = StepOutput(out, HostCopy(next_ids), clock.stop(), errors)
        if batch.forward_mode.is_verify():
            res.verified = self.spec.verify(batch, out.row_logits, res.next_ids, errors)
        return res

    @abstractmethod
    def _resolve_inputs(self, fb: ForwardBatch, has_future: bool) -> None:
        """Replace the inputs that name future slots by the tokens sampled there."""

    @abstractmethod
    def _store_outputs(self, slots: list[int] | None, next_ids: torch.Tensor) -> None:
        """Store the sampled ids in this step's future slots."""

    # --- the step in flight ---------------------------------------------------------------
    @abstractmethod
    def keep_in_flight(self, launched: LaunchedBatch) -> bool:
        """Leave a launched decode step running while the next is built; False: process it now."""

    @abstractmethod
    def take_in_flight(self) -> LaunchedBatch | None:
        """The step in flight, which is no longer in flight (None: there is none)."""

    @abstractmethod
    def set_in_flight(self, launched: LaunchedBatch) -> None:
        """launched stays in flight (a step launched behind the one taken)."""

    @abstractmethod
    def holds(self, req: Req) -> bool:
        """Whether the step in flight still reads req's KV."""

    @abstractmethod
    def defer_release(self, req: Req) -> None:
        """Release req's KV once the step in flight is processed."""

    @abstractmethod
    def in_flight(self) -> bool:
        """Whether a step is in flight."""

    @abstractmethod
    def drain(self) -> None:
        """Wait until every step handed over has run."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the worker thread, if any."""


class InlineExecutor(BaseExecutor):
    """Every step runs at once on the scheduler thread; none stays in flight."""

    def _reads_future(self, batch: ScheduleBatch) -> bool:
        return False

    def _future_slots(self, batch: ScheduleBatch) -> list[int] | None:
        return None

    def _submit(
        self, batch: ScheduleBatch, fb: ForwardBatch, slots: list[int] | None, has_future: bool
    ) -> Future:
        result = Future()
        result.set_result(self.run_step(batch, fb, slots, has_future))
        return result

    def _resolve_inputs(self, fb: ForwardBatch, has_future: bool) -> None:
        pass

    def _store_outputs(self, slots: list[int] | None, next_ids: torch.Tensor) -> None:
        pass

    def keep_in_flight(self, launched: LaunchedBatch) -> bool:
        return False

    def take_in_flight(self) -> LaunchedBatch | None:
        return None

    def set_in_flight(self, launched: LaunchedBatch) -> None:
        raise AssertionError("no step stays in flight without overlap")

    def holds(self, req: Req) -> bool:
        return False

    def defer_release(self, req: Req) -> None:
        raise AssertionError("no step in flight")

    def in_flight(self) -> bool:
        return False

    def drain(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class OverlapExecutor(BaseExecutor):
    def __init__(
        self,
        runner: ModelRunner,
        cache_manager: CacheManager,
        grammar: GrammarManager,
        spec: BaseSpeculation,
    ):
        super().__init__(runner, cache_manager, grammar, spec)
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="radixlm-forward")
        self.future_map = FutureTokenMap(2 * runner.max_running_requests + 2, runner.device)
        self.context_len = runner.context_len
        self._in_flight: LaunchedBatch | None = None

    def _future_slots(self, batch: ScheduleBatch) -> list[int] | None:
        """Decode steps store their sampled ids in future slots, for the next step to read."""
        if not batch.forward_mode.is_decode():
            return None
        slots = self.future_map.alloc(batch.batch_size())
        for r, slot in zip(batch.decode_reqs, slots):
            r.future_slot = slot
        return slots

    def _reads_future(self, batch: ScheduleBatch) -> bool:
        # Their future slots belong to the step in flight (checked before this step takes new ones).
        return any(r.future_slot is not None for r in batch.decode_reqs)

    def _submit(
        self, batch: ScheduleBatch, fb: ForwardBatch, slots: list[int] | None, has_future: bool
    ) -> Future:
        return self.worker.submit(self.run_step, batch, fb, slots, has_future)

    def _resolve_inputs(self, fb: ForwardBatch, has_future: bool) -> None:
        if has_future:
            fb.input_ids = self.future_map.resolve(fb.input_ids)

    def _store_outputs(self, slots: list[int] | None, next_ids: torch.Tensor) -> None:
        if slots is not None:
            self.future_map.store(slots, next_ids)

    def keep_in_flight(self, launched: LaunchedBatch) -> bool:
        batch = launched.batch
        if batch.forward_mode.is_decode() and can_overlap(batch.decode_reqs, self.context_len):
            self._in_flight = launched
            return True
        return False

    def take_in_flight(self) -> LaunchedBatch | None:
        prev, self._in_flight = self._in_flight, None
        return prev

    def set_in_flight(self, launched: LaunchedBatch) -> None:
        self._in_flight = launched

    def holds(self, req: Req) -> bool:
        return self._in_flight is not None and self._in_flight.holds(req)

    def defer_release(self, req: Req) -> None:
        self._in_flight.deferred_release.append(req)

    def in_flight(self) -> bool:
        return self._in_flight is not None

    def drain(self) -> None:
        self.worker.submit(lambda: None).result()

    def shutdown(self) -> None:
        self.worker.shutdown()
