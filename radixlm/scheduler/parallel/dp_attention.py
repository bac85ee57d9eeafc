"""How the schedulers of DP-attention ranks stay in step (docs/architecture.md, "DP attention").

Each rank schedules its own requests, but the MoE layers of a forward gather every rank's tokens,
so in any step where some rank runs a batch every rank must run a forward: its own batch, or an
idle one that only joins the MoE layers' collectives (the model's forward_idle; SGLang's IDLE
batch). DPAttentionStep.join exchanges, once per step and before any forward, whether each rank
has a batch, plus what rank 0 needs for the next step: how long each rank could wait for messages
and how many requests and tokens it holds (DPView: the dispatcher's loads).

A forward that fails on one rank may leave the others inside a collective: the rank stops
(DPForwardFailed), its peers' collectives then fail too, and the engine ends (the watchdog answers
the requests in flight with 503s; --restart-on-failure starts it again).

BaseDPAttention names what the scheduler calls; NoDPAttention is the twin of a scheduler alone (or
a TP group, which runs one schedule).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from radixlm.distributed.communicator import Communicator
from radixlm.scheduler.execution.overlap import LaunchedBatch
from radixlm.scheduler.parallel.dp_dispatch import BLOCK, DPDispatcher, DPView
from radixlm.scheduler.parallel.tp_sync import BaseStepSync, TPStepSync

# (poll timeout in ms this rank would wait for a message, requests it holds, their tokens)
RankState = Callable[[], tuple[int, int, int]]


@runtime_checkable
class IdleForward(Protocol):
    """A model whose rank can join the MoE layers' collectives without a batch (the MoE models:
    DeepSeek-V2/V3, Qwen2/3-MoE, Mixtral, OLMoE)."""

    def forward_idle(self) -> None: ...


class DPForwardFailed(RuntimeError):
    """This rank's forward failed: the other ranks may wait on it in a collective."""


class BaseDPAttention(ABC):
    @abstractmethod
    def attach(self, model: nn.Module, state: RankState, kv_tokens: int) -> None:
        """The scheduler's model, its state and its KV pool's size (once the scheduler has them)."""

    @abstractmethod
    def join(self, has_batch: bool) -> None:
        """This rank's step runs a batch (or not): called once per step, before any forward."""

    @abstractmethod
    def check(self, launched: LaunchedBatch) -> None:
        """After a launch: stop here if this rank's forward failed."""

    @abstractmethod
    def all_idle(self) -> bool:
        """No rank holds a request, as every rank knows alike (a weight update swaps every rank's
        weights in the same step, never under another rank's running requests)."""

    @abstractmethod
    def control_sync(self, sync: BaseStepSync) -> BaseStepSync:
        """How the ranks agree on a control call's outcome (a weight update's error)."""

    @abstractmethod
    def info(self) -> dict:
        """For /get_server_info's internal_state."""


class NoDPAttention(BaseDPAttention):
    def attach(self, model: nn.Module, state: RankState, kv_tokens: int) -> None:
        pass

    def join(self, has_batch: bool) -> None:
        pass

    def check(self, launched: LaunchedBatch) -> None:
        pass

    def all_idle(self) -> bool:
        return True

    def control_sync(self, sync: BaseStepSync) -> BaseStepSync:
        return sync

    def info(self) -> dict:
        return {}


class DPAttentionStep(BaseDPAttention):
    def __init__(self, comm: Communicator, view: DPView, dispatcher: DPDispatcher | None):
        """comm: the world's gloo communicator (the schedulers' own group, not the forward's);
        dispatcher: rank 0's."""
        self.comm, self.view, self.dispatcher = comm, view, dispatcher
        self.model: nn.Module | None = None
        self.state: RankState | None = None
        self.idle_forwards = 0

    def attach(self, model: nn.Module, state: RankState, kv_tokens: int) -> None:
        if not isinstance(model, IdleForward):
            raise ValueError(
                "enable_dp_attention needs a mixture-of-experts model (DeepSeek-V2/V3,"
                f" Qwen2/3-MoE, Mixtral, OLMoE); {type(model).__name__} is not one: serve it with"
                " --dp-size alone (replicas behind the router)"
            )
        self.model, self.state = model, state
        if self.dispatcher is not None:  # every rank's pool is this size (the same options)
            self.dispatcher.index.capacity = max(1, kv_tokens // BLOCK)

    def join(self, has_batch: bool) -> None:
        mine = torch.tensor([int(has_batch), *self.state()], dtype=torch.int64)
        every = self.comm.all_gather(mine, dim=0).view(-1, 4).tolist()
        v = self.view
        v.timeouts_ms, v.requests, v.tokens = ([e[k] for e in every] for k in (1, 2, 3))
        v.stale = False
        if self.dispatcher is not None:
            self.dispatcher.step_seen()
        if not has_batch and any(e[0] for e in every):
            self.idle_forwards += 1
            with torch.inference_mode():
                self.model.forward_idle()

    def check(self, launched: LaunchedBatch) -> None:
        error = launched.result.exception() if launched.result.done() else None
        if error is not None:
            raise DPForwardFailed(
                f"DP attention rank {self.comm.rank}: a forward failed ({type(error).__name__}: "
                f"{error}); the other ranks may be waiting on it, so the engine stops"
            ) from error

    def all_idle(self) -> bool:
        return not self.view.stale and not any(self.view.requests)

    def control_sync(self, sync: BaseStepSync) -> BaseStepSync:
        return DPControlSync(self.comm)

    def info(self) -> dict:
        info = {
            "dp_rank": self.comm.rank,
            "pid": os.getpid(),
            "dp_idle_forwards": self.idle_forwards,
        }
        if self.dispatcher is not None:
            info["dp_dispatch"] = self.dispatcher.info()
        return info


class DPControlSync(TPStepSync):
    """Control calls that every rank handles in the same step (a weight update: at its message, or
    once all_idle): an error on any rank is an error on all, so no rank swaps weights alone. A
    weight is read back from rank 0's own copy (every rank holds the whole model, its experts
    aside).
    """

    def gather(self, obj) -> list:
        return [obj]
