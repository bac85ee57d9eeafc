"""How the scheduler ranks of a tensor-parallel group stay in step (docs/architecture.md, "Tensor
parallelism").

Every rank runs the same scheduler on the same messages (tp_io.TPSchedulerIO broadcasts rank 0's
each step), so the radix cache, the policy (same seed) and admission decide the same everywhere.
What does not follow from the messages alone is agreed here, at points every rank reaches in the
same order:
- a grammar compile finishes on a thread pool, at a different moment on each rank: a compile
  counts as done when it is done on every rank (all_done);
- step times differ per rank: the speculative cost model learns rank 0's (AgreedStepCosts).
Sampling needs no agreement: the logits are all-gathered (the same bits everywhere) and the
samplers draw from generators seeded alike. With --enable-invariant-checks, TPStateCheck compares
a hash of each step's outcome across the ranks and stops on the first difference.
BaseStepSync names these points; a single process has NoStepSync and its twin checks: nothing
changes there.
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod

import torch

from radixlm.distributed.communicator import Communicator
from radixlm.errors import InvariantError
from radixlm.scheduler.invariants import BaseInvariantChecks
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req_queues import ReqQueues


class BaseStepSync(ABC):
    """What the ranks of a group agree on, at points every rank reaches in the same order."""

    @abstractmethod
    def all_done(self, flags: list[bool]) -> list[bool]:
        """flags[i] on every rank -> whether it holds on all of them."""

    @abstractmethod
    def agree(self, value: float) -> float:
        """Rank 0's value, on every rank."""

    @abstractmethod
    def gather(self, obj) -> list:
        """Every rank's obj, in rank order (a weight read back: each rank holds its shard)."""

    @abstractmethod
    def checked(
        self, checks: BaseInvariantChecks, cm: CacheManager, queues: ReqQueues
    ) -> BaseInvariantChecks:
        """The invariant checks of this scheduler (with --enable-invariant-checks)."""


class NoStepSync(BaseStepSync):
    """A single scheduler: its own view is the agreed one."""

    def all_done(self, flags: list[bool]) -> list[bool]:
        return flags

    def agree(self, value: float) -> float:
        return value

    def gather(self, obj) -> list:
        return [obj]

    def checked(
        self, checks: BaseInvariantChecks, cm: CacheManager, queues: ReqQueues
    ) -> BaseInvariantChecks:
        return checks


class TPStepSync(BaseStepSync):
    def __init__(self, comm: Communicator):
        self.comm = comm

    def all_done(self, flags: list[bool]) -> list[bool]:
        if not flags:
            return flags
        t = torch.tensor(flags, dtype=torch.int32)
        self.comm.all_reduce(t)
        return (t == self.comm.world_size).tolist()

    def agree(self, value: float) -> float:
        return float(self.comm.broadcast(torch.tensor([value], dtype=torch.float64), 0).item())

    def gather(self, obj) -> list:
        return [self.comm.broadcast_pyobj(obj, src=r) for r in range(self.comm.world_size)]

    def checked(
        self, checks: BaseInvariantChecks, cm: CacheManager, queues: ReqQueues
    ) -> BaseInvariantChecks:
        return TPStateCheck(checks, cm, queues, self.comm)


class AgreedStepCosts:
    """A speculative StepCostModel that learns rank 0's step times on every rank (draft lengths
    follow from the model, so they must be the same)."""

    def __init__(self, costs, sync: BaseStepSync):
        self.costs = costs
        self.sync = sync

    def observe(self, rows: int, seconds: float) -> None:
        self.costs.observe(rows, self.sync.agree(seconds))

    def __getattr__(self, name):
        return getattr(self.costs, name)


def state_digest(cm: CacheManager, queues: ReqQueues) -> int:
    """64 bits of what a step decided: every request's place, tokens and KV, the pools' counts."""
    h = hashlib.blake2b(digest_size=8)
    rows = cm.req_to_token_pool.req_to_token
    for r in queues:
        h.update(
            f"{r.rid}|{r.status.value}|{r.req_pool_idx}|{r.kv_allocated_len}|{r.cache_protected_len}|"
            f"{len(r.output_ids)}|{r.output_ids[-1:]}".encode()
        )
        if r.req_pool_idx is not None and r.kv_allocated_len:
            h.update(rows[r.req_pool_idx, : r.kv_allocated_len].cpu().numpy().tobytes())
    tree = cm.tree_cache
    h.update(
        struct.pack(
            "<4q",
            cm.token_to_kv_pool.available_size(),
            tree.evictable_size(),
            tree.protected_size(),
            cm.req_to_token_pool.available_size(),
        )
    )
    return int.from_bytes(h.digest(), "little", signed=True)


class TPStateCheck(BaseInvariantChecks):
    """--enable-invariant-checks with tp > 1: the checks of one scheduler, then the step's digest
    compared across the ranks (an all-gather of 8 bytes)."""

    def __init__(
        self, inner: BaseInvariantChecks, cm: CacheManager, queues: ReqQueues, comm: Communicator
    ):
        self.inner, self.cm, self.queues, self.comm = inner, cm, queues, comm
        self.steps = 0

    def after_step(self) -> None:
        self.inner.after_step()
        self.steps += 1
        mine = torch.tensor([state_digest(self.cm, self.queues)], dtype=torch.int64)
        every = self.comm.all_gather(mine, dim=0).tolist()
        if len(set(every)) != 1:
            raise InvariantError(
                f"tensor-parallel ranks diverged at step {self.steps}: state digests {every} "
                f"(rank {self.comm.rank} holds {len(list(self.queues))} requests)"
            )
