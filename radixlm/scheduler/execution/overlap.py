"""The overlap scheduler's parts. While the model runs decode step N on a worker thread (torch
releases the GIL inside its ops), the scheduler thread builds and launches step N+1 and then
processes N's results, so the Python work of a step hides behind the next step's forward.

Step N+1 is built before N's sampled tokens are known on the scheduler thread: its input ids
name them by future slots (-(slot + 1)), resolved on the worker from the ids N wrote there.
A request that N finishes (EOS, stop string) has run one extra step in N+1, whose token is
dropped; its row and KV slots stay its own (the release is deferred) until N+1 completes, so no
new request gets them while N+1 may still use them. N+1's attention metadata is built on the
scheduler thread at launch, so the worker never reads rows the scheduler is rewriting.
Requests whose next step depends on N's token on the scheduler side (grammar masks, penalties,
bad_words, DRY, min_new_tokens, a step that reaches max_new_tokens or the context) are not
overlapped: the scheduler then waits for N first.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from radixlm.model.executor.runner import LogitsOutput
from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.host_copy import HostCopy, to_device
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.req import Req
from radixlm.speculative.verify import Acceptance

# Leading prompt tokens that tell a request following up a finished one (follows_up).
FOLLOW_UP_HEAD = 32


def follows_up(finished: list[Req], waiting: list[Req]) -> bool:
    """Some waiting request starts as one that finished (its next turn, likely)."""
    if not finished or not waiting:
        return False
    heads = {tuple(r.origin_input_ids[:FOLLOW_UP_HEAD]) for r in finished}
    return any(tuple(w.origin_input_ids[:FOLLOW_UP_HEAD]) in heads for w in waiting)


class FutureTokenMap:
    """Ring of token-id slots on the device: step N writes its sampled ids, step N+1 reads them."""

    def __init__(self, size: int, device):
        self.size = size
        self.ids = torch.zeros(size, dtype=torch.int64, device=device)
        self._next = 0

    def alloc(self, n: int) -> list[int]:
        slots = [(self._next + i) % self.size for i in range(n)]
        self._next = (self._next + n) % self.size
        return slots

    def resolve(self, input_ids: torch.Tensor) -> torch.Tensor:
        future = input_ids < 0
        return torch.where(future, self.ids[(-input_ids - 1).clamp(min=0)], input_ids)

    def store(self, slots: list[int], next_ids: torch.Tensor) -> None:
        self.ids[to_device(slots, torch.int64, self.ids.device)] = next_ids


def can_overlap(reqs: list[Req], context_len: int) -> bool:
    """Whether the next decode step of these requests may be built before this step's tokens
    are known on the scheduler thread."""
    for r in reqs:
        sp = r.sampling_params
        if (
            r.grammar is not None
            or sp.frequency_penalty
            or sp.presence_penalty
            or sp.repetition_penalty != 1.0
        ):
            return False
        if sp.uses_history_samplers:  # bad_words, DRY: they read the outputs so far
            return False
        n_out = len(r.output_ids) + (r.future_slot is not None)
        if (
            n_out < sp.min_new_tokens
            or n_out >= sp.max_new_tokens
            or r.kv_allocated_len + 1 >= context_len
        ):
            return False
    return True


class StepClock:
    """A step's forward + sampling time. On CUDA two events on the stream bound it: the worker
    thread queues a step and goes on without waiting for the GPU, so only the GPU can time it.
    Elsewhere the wall clock of the thread that ran it."""

    def __init__(self, device: torch.device):
        self._events = device.type == "cuda"
        if self._events:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> StepClock:
        if self._events:
            self._end = torch.cuda.Event(enable_timing=True)
            self._end.record()
        else:
            self._end = time.perf_counter()
        return self

    def seconds(self) -> float:
        if self._events:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1e3
        return self._end - self._start


@dataclass
class StepOutput:
    """What the worker returns for one launched batch: its sampled ids may still be on their way
    to the host (read them through next_ids, which waits)."""

    logits: LogitsOutput
    ids: HostCopy
    clock: StepClock
    # Rows whose grammar mask could not be filled: that request fails, the others go on.
    row_errors: dict[int, str] = field(default_factory=dict)
    # TARGET_VERIFY: per request, what the step emits (accepted draft nodes' tokens + the model's
    # token) and the accepted nodes.
    verified: list[Acceptance] | None = None

    def wait(self) -> StepOutput:
        """Wait until the step's ids are on the host (a failure on the device raises here)."""
        self.ids.tolist()
        return self

    @property
    def next_ids(self) -> list[int]:
        return self.ids.tolist()

    @property
    def seconds(self) -> float:
        return self.clock.seconds()


@dataclass
class LaunchedBatch:
    """A batch whose forward + sampling was handed to the worker (or already ran inline)."""

    batch: ScheduleBatch
    worker_batch: ModelWorkerBatch
    result: Future  # -> StepOutput
    future_slots: list[int] | None = None  # where the worker stores the sampled ids
    launch_time: float = 0.0  # time.perf_counter() when handed over
    # Requests that finished while this batch was in flight: released once it completes.
    deferred_release: list[Req] = field(default_factory=list)

    def __post_init__(self):
        self.req_ids = {id(r) for r in self.batch.reqs}

    def holds(self, req: Req) -> bool:
        return id(req) in self.req_ids
