"""A scheduler rank of a tensor-parallel group, a pipeline stage or DP attention: the process setup
before its Scheduler exists."""

from __future__ import annotations

import dataclasses
import logging

from radixlm.config import PortArgs
from radixlm.distributed.communicator import Communicator
from radixlm.distributed.parallel_state import init_parallel_state
from radixlm.distributed.rank import RankSpec, pin_cpus, start_heartbeat
from radixlm.scheduler.channels import BaseSchedulerIO, SchedulerIO
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.parallel.dp_attention import BaseDPAttention, DPAttentionStep, NoDPAttention
from radixlm.scheduler.parallel.dp_dispatch import DPDispatcher, DPView
from radixlm.scheduler.parallel.dp_io import DPSchedulerIO
from radixlm.scheduler.parallel.tp_io import TPSchedulerIO
from radixlm.scheduler.parallel.tp_sync import BaseStepSync, NoStepSync, TPStepSync
from radixlm.utils import host_threads

logger = logging.getLogger(__name__)


def rank_threads(config: SchedulerConfig, spec: RankSpec, cpus: list[int] | None) -> int:
    """--num-threads (per rank), else the rank's pinned cores, else its share of the host's
    (utils.host_threads)."""
    if config.runner.num_threads:
        return config.runner.num_threads
    return len(cpus) if cpus else max(1, host_threads() // spec.dist.ranks_per_node)


def join_tp_group(
    config: SchedulerConfig, port_args: PortArgs | None, spec: RankSpec
) -> tuple[SchedulerConfig, BaseSchedulerIO, BaseStepSync, BaseDPAttention]:
    """Beat, pin, join the world; -> what this rank's Scheduler is built from (its config with the
    rank's threads, its channels, its sync, its DP-attention step). The model built next is this
    rank's shard."""
    start_heartbeat(spec.heartbeat)
    cpus = pin_cpus(spec.cpus)
    threads = rank_threads(config, spec, cpus)
    config = dataclasses.replace(
        config, runner=dataclasses.replace(config.runner, num_threads=threads)
    )
    state = init_parallel_state(spec.dist, spec.rank)
    logger.info(
        "rank %d of %d: cores %s, %d thread(s)",
        spec.rank,
        spec.dist.world_size,
        cpus or "unpinned",
        threads,
    )
    comm = state.scheduler_comm
    if spec.dist.enable_dp_attention:
        return (config, *_dp_attention(comm, port_args, config))
    # Every rank (each stage of a pipeline too) runs the same Scheduler on the messages rank 0 got.
    if state.world_rank != 0:  # the ranks' trees are the same: rank 0 alone publishes their events
        config = dataclasses.replace(config, kv_events=None)
    io = TPSchedulerIO(comm, SchedulerIO(port_args) if state.world_rank == 0 else None)
    return config, io, TPStepSync(comm), NoDPAttention()


def _dp_attention(
    comm: Communicator, port_args: PortArgs, config: SchedulerConfig
) -> tuple[DPSchedulerIO, BaseStepSync, DPAttentionStep]:
    """DP attention: each rank schedules its own requests (a sync of its own: nothing to agree on
    beyond the step exchange), rank 0 dispatching them."""
    view = DPView(comm.world_size)
    dispatcher = DPDispatcher(view, config.load_balance_method) if comm.rank == 0 else None
    return (
        DPSchedulerIO(comm, port_args, view, dispatcher),
        NoStepSync(),
        DPAttentionStep(comm, view, dispatcher),
    )
