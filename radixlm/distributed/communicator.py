"""Communicator: the collective operations a process group offers, whatever carries them.

Implementations: SingleProcessCommunicator (a group of one: every op is the identity, so tp=1 pays
nothing), TorchDistCommunicator (torch.distributed over a gloo group for CPU tensors, or an NCCL
group for CUDA tensors) and shm_communicator.ShmCommunicator (ranks on one host: all-reduce and
all-gather through shared memory, the rest delegated to gloo). Pipeline parallelism uses
isend/recv (and broadcast_pyobj for the logits), expert parallelism all_reduce over its group, DP
attention all_gather.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from typing import Any

import torch


class Communicator(ABC):
    rank: int  # this process's rank within the group
    world_size: int

    @abstractmethod
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place; returns t. Every rank ends with the same bits."""

    @abstractmethod
    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's t (same shape on all), concatenated along dim in rank order (a new
        tensor)."""

    @abstractmethod
    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """t of rank src, in place on the others; returns t."""

    @abstractmethod
    def send(self, t: torch.Tensor, dst: int) -> None:
        """Point to point (pipeline stages hand hidden states on)."""

    def isend(self, t: torch.Tensor, dst: int) -> Any:
        """send without waiting: a handle whose wait() returns once t may be reused (this default
        sends now)."""
        self.send(t, dst)
        return _Done()

    @abstractmethod
    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        """Fill t from rank src; returns t."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank got here."""

    def broadcast_pyobj(self, obj: Any, src: int = 0) -> Any:
        """obj of rank src (pickled; the others pass anything, e.g. None) on every rank. The size
        goes by all-reduce, not broadcast: every rank then hears from every other on each call, so a
        dead peer is an error on every rank (a broadcast's root only sends, and a send to a peer
        that died can succeed into the socket's buffer)."""
        data = None
        size = torch.zeros(1, dtype=torch.int64)
        if self.rank == src:
            data = torch.frombuffer(
                bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8
            )
            size[0] = data.numel()
        self.all_reduce(size)
        if self.rank != src:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self.broadcast(data, src)
        return obj if self.rank == src else pickle.loads(data.numpy().tobytes())

    def close(self) -> None:
        """Release what the communicator holds (shared memory); the process group outlives it."""


class _Done:
    def wait(self) -> None:
        pass


class SingleProcessCommunicator(Communicator):
    """A group of one: nothing to exchange."""

    rank, world_size = 0, 1

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return t

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        return t

    def send(self, t: torch.Tensor, dst: int) -> None:
        raise RuntimeError("send in a group of one process")

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        raise RuntimeError("recv in a group of one process")

    def barrier(self) -> None:
        pass

    def broadcast_pyobj(self, obj: Any, src: int = 0) -> Any:
        return obj


class TorchDistCommunicator(Communicator):
    """torch.distributed over one process group: gloo (CPU tensors) or NCCL (CUDA tensors on
    `device`; tensors are moved there and back where needed)."""

    def __init__(self, group, device: torch.device | None = None):
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device or torch.device("cpu")
        self._ranks = dist.get_process_group_ranks(
            group
        )  # group rank -> global rank (send/recv/src)

    def _global(self, group_rank: int) -> int:
        return self._ranks[group_rank]

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        self.dist.all_reduce(t, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        self.dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        self.dist.broadcast(t, src=self._global(src), group=self.group)
        return t

    def send(self, t: torch.Tensor, dst: int) -> None:
        self.dist.send(t.contiguous(), dst=self._global(dst), group=self.group)

    def isend(self, t: torch.Tensor, dst: int) -> Any:
        return self.dist.isend(t.contiguous(), dst=self._global(dst), group=self.group)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        self.dist.recv(t, src=self._global(src), group=self.group)
        return t

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)


class GlooCommunicator(TorchDistCommunicator):
    """CPU tensors over a gloo group (SGLang's tp cpu_group); also carries broadcast_pyobj."""


class NcclCommunicator(TorchDistCommunicator):
    """CUDA tensors over an NCCL group (exercised only where a GPU is present)."""

    def broadcast_pyobj(self, obj: Any, src: int = 0) -> Any:
        raise RuntimeError(
            "broadcast_pyobj goes over the group's gloo communicator (cpu_comm), not NCCL"
        )
