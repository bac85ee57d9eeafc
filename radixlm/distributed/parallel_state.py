"""The world of ranks and its process groups by role (SGLang's parallel_state, without globals
scattered around: one ParallelState, set once per process).

A rank is one scheduler process. The world is pp_size pipeline stages of one tensor-parallel group
(tp) each; pp groups join the ranks of the same tp index across the stages (send/recv of hidden
states between stages, the last stage's logits broadcast back). Further roles:
  ep        expert parallelism for MoE (all-reduce over the experts' group),
  attn_dp   DP attention (--enable-dp-attention): every rank of the world, each with its own requests;
            the MoE layers all-gather their tokens over it (its device_comm), and the schedulers
            exchange their messages and step states over the world's gloo group. The tp group is
            then tp_size / dp_size ranks (one for now), so each rank holds a whole attention.
Ranks are laid out tp-major: the tp group of global rank r is the tp_size consecutive ranks
around it; stage s holds ranks s * tp_size .. (s + 1) * tp_size - 1 (SGLang's layout).

A process that never called init_parallel_state (tp=1, tests, benchmarks) sees a world of one
whose groups are SingleProcessCommunicator: every collective is the identity.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field

import torch

from radixlm.distributed.communicator import (
    Communicator,
    GlooCommunicator,
    NcclCommunicator,
    SingleProcessCommunicator,
)
from radixlm.distributed.config import ALLREDUCE_BACKENDS, DistConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupCoordinator:
    """One process group of a role: where this rank sits in it and how it talks."""

    name: str  # "tp", "pp", "ep", "attn_dp"
    ranks: tuple[int, ...]  # global ranks of the group, in group order
    rank_in_group: int
    device_comm: (
        Communicator  # tensors of the forward (all-reduce of row-parallel outputs, logits gather)
    )
    cpu_comm: (
        Communicator  # gloo: the scheduler's messages (broadcast_pyobj), step hashes, barriers
    )

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0


def _single_group(name: str) -> GroupCoordinator:
    comm = SingleProcessCommunicator()
    return GroupCoordinator(name, (0,), 0, comm, comm)


@dataclass(frozen=True)
class ParallelState:
    world_rank: int = 0
    world_size: int = 1
    tp: GroupCoordinator = field(default_factory=lambda: _single_group("tp"))
    pp: GroupCoordinator = field(default_factory=lambda: _single_group("pp"))
    pp_layer_partition: tuple[int, ...] | None = None  # layers per stage (None: even)
    # The scheduler's messages go to every rank of the world: the tp group's when there is one
    # stage.
    world_cpu_comm: Communicator | None = None
    # Expert parallelism: the tp group's ranks and communicators when ep_size == tp_size > 1.
    ep: GroupCoordinator = field(default_factory=lambda: _single_group("ep"))
    # DP attention: the whole world (one rank alone without --enable-dp-attention).
    attn_dp: GroupCoordinator = field(default_factory=lambda: _single_group("attn_dp"))

    @property
    def scheduler_comm(self) -> Communicator:
        return self.world_cpu_comm or self.tp.cpu_comm


_STATE = ParallelState()


def get_parallel_state() -> ParallelState:
    return _STATE


def get_tp_group() -> GroupCoordinator:
    return _STATE.tp


def get_pp_group() -> GroupCoordinator:
    return _STATE.pp


def get_ep_group() -> GroupCoordinator:
    return _STATE.ep


def get_attn_dp_group() -> GroupCoordinator:
    return _STATE.attn_dp


def set_parallel_state(state: ParallelState) -> None:
    """Install a state (init_parallel_state does; tests may install a hand-made one)."""
    global _STATE
    _STATE = state


def init_parallel_state(config: DistConfig, rank: int) -> ParallelState:
    """Join the world (torch.distributed over gloo, rendezvous at config.init_method) and build the
    groups this rank belongs to. Blocks until every rank joined or config.timeout passes."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=config.timeout)
    dist.init_process_group(
        "gloo",
        init_method=config.init_method,
        world_size=config.world_size,
        rank=rank,
        timeout=timeout,
    )
    pp_size = config.pp_size
    tp = _tp_group(config, rank, timeout)
    pp, world_cpu, attn_dp = _single_group("pp"), None, _single_group("attn_dp")
    if pp_size > 1:
        pp = _pp_group(config, rank, timeout)
        world_cpu = GlooCommunicator(
            dist.new_group(list(range(config.world_size)), backend="gloo", timeout=timeout)
        )
    if config.enable_dp_attention:
        attn_dp = _world_group(config, rank, timeout)
        world_cpu = attn_dp.cpu_comm
    # Experts split over the tp group, or with DP attention over every rank (their tokens gathered).
    experts = attn_dp if config.enable_dp_attention else tp
    ep = (
        GroupCoordinator(
            "ep", experts.ranks, experts.rank_in_group, experts.device_comm, experts.cpu_comm
        )
        if config.ep_size > 1
        else _single_group("ep")
    )
    state = ParallelState(
        rank, config.world_size, tp, pp, config.pp_layer_partition, world_cpu, ep, attn_dp
    )
    set_parallel_state(state)
    logger.info(
        "rank %d of %d joined (tp group %s, all-reduce over %s; pipeline stage %d of %d%s)",
        rank,
        config.world_size,
        list(tp.ranks),
        type(tp.device_comm).__name__,
        pp.rank_in_group,
        pp.world_size,
        f"; DP attention rank {rank} of {attn_dp.world_size}" if config.enable_dp_attention else "",
    )
    return state


def _tp_group(config: DistConfig, rank: int, timeout) -> GroupCoordinator:
    """This rank's tensor-parallel group (attn_tp_size consecutive ranks; a group of one is this
    rank alone, as DP attention's attention groups are for now)."""
    import torch.distributed as dist

    tp_size = config.attn_tp_size
    if tp_size == 1:
        comm = SingleProcessCommunicator()
        return GroupCoordinator("tp", (rank,), 0, comm, comm)
    found = None
    for start in range(
        0, config.world_size, tp_size
    ):  # every rank creates every group, in the same order
        ranks = list(range(start, start + tp_size))
        cpu = dist.new_group(ranks, backend="gloo", timeout=timeout)
        # The forward's own group: with overlap scheduling it runs on a worker thread beside the
        # scheduler's broadcasts, and two threads must never interleave collectives on one group.
        dev = dist.new_group(
            ranks, backend="nccl" if config.allreduce_backend == "nccl" else "gloo", timeout=timeout
        )
        if rank in ranks:
            found = (tuple(ranks), cpu, dev)
    assert found is not None
    ranks, cpu, dev = found
    return GroupCoordinator(
        "tp", ranks, ranks.index(rank), _device_comm(config, dev), GlooCommunicator(cpu)
    )


def _world_group(config: DistConfig, rank: int, timeout) -> GroupCoordinator:
    """DP attention's group: every rank; its own device group for the MoE layers' gathers (the
    forward's thread) beside the gloo group the schedulers talk over."""
    import torch.distributed as dist

    ranks = list(range(config.world_size))
    cpu = GlooCommunicator(dist.new_group(ranks, backend="gloo", timeout=timeout))
    dev = dist.new_group(
        ranks, backend="nccl" if config.allreduce_backend == "nccl" else "gloo", timeout=timeout
    )
    return GroupCoordinator("attn_dp", tuple(ranks), rank, _device_comm(config, dev), cpu)


def _pp_group(config: DistConfig, rank: int, timeout) -> GroupCoordinator:
    """The ranks of one tp index across the stages, in stage order: the hidden states go over the
    device group (gloo; NCCL on CUDA), the last stage's logits over the cpu group (pickled)."""
    import torch.distributed as dist

    found = None
    for t in range(config.tp_size):
        ranks = [s * config.tp_size + t for s in range(config.pp_size)]
        cpu = dist.new_group(ranks, backend="gloo", timeout=timeout)
        dev = dist.new_group(
            ranks, backend="nccl" if config.allreduce_backend == "nccl" else "gloo", timeout=timeout
        )
        if rank in ranks:
            found = (tuple(ranks), cpu, dev)
    assert found is not None
    ranks, cpu, dev = found
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if config.allreduce_backend == "nccl"
        else None
    )
    dev_comm = NcclCommunicator(dev, device) if device is not None else GlooCommunicator(dev)
    return GroupCoordinator("pp", ranks, ranks.index(rank), dev_comm, GlooCommunicator(cpu))


def _device_comm(config: DistConfig, dev_group) -> Communicator:
    backend = config.allreduce_backend
    assert backend in ALLREDUCE_BACKENDS and backend != "auto", backend  # DistConfig resolved auto
    if backend == "nccl":
        return NcclCommunicator(dev_group, torch.device("cuda", torch.cuda.current_device()))
    gloo = GlooCommunicator(dev_group)
    if backend == "shm":
        from radixlm.distributed.shm_communicator import ShmCommunicator

        return ShmCommunicator(gloo, timeout=config.timeout)
    return gloo


def destroy_parallel_state() -> None:
    """Leave the world (a clean exit; a killed rank just goes)."""
    import torch.distributed as dist

    state = get_parallel_state()
    state.tp.device_comm.close()
    state.attn_dp.device_comm.close()
    set_parallel_state(ParallelState())
    if dist.is_initialized():
        dist.destroy_process_group()


def tp_rank_and_size(group: GroupCoordinator | None = None) -> tuple[int, int]:
    g = group or get_tp_group()
    return g.rank_in_group, g.world_size
