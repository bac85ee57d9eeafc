"""Starting the scheduler ranks of a tensor-parallel engine on this node (docs/architecture.md,
"Tensor parallelism").

Each rank is a child process (process_context.py) running run_scheduler_process with its
RankSpec: its global rank, the DistConfig (rendezvous address, timeout, all-reduce backend), its
slice of this node's cores (disjoint when there are enough; unpinned otherwise) and a heartbeat.
Node 0 runs rank 0, which owns the scheduler's channels, next to the detokenizer (launcher.py); a
node > 0 runs only its ranks and waits (node.py: run_node). PYTHONHASHSEED is fixed for the ranks:
every rank must iterate its sets and dicts of strings in the same order to make the same decisions.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from radixlm.config import PortArgs
from radixlm.distributed.config import DistConfig
from radixlm.distributed.rank import RankSpec, new_heartbeat
from radixlm.engine.process_context import child_process, fixed_hash_seed
from radixlm.errors import StartupRefusalError
from radixlm.utils import core_shares

if TYPE_CHECKING:
    from radixlm.scheduler.config import SchedulerConfig

logger = logging.getLogger(__name__)


def node_cores() -> list[int]:
    return (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )


def rank_cpus(dist: DistConfig) -> list[list[int]]:
    """Each local rank's cores: disjoint slices of this process's cores, or none (unpinned) when
    there are fewer cores than ranks."""
    cores = node_cores()
    n = dist.ranks_per_node
    return core_shares(n, cores) if n <= len(cores) else [[] for _ in range(n)]


def start_ranks(
    ctx, config: SchedulerConfig, dist: DistConfig, port_args: PortArgs | None
) -> list[tuple]:
    """Start this node's ranks; [(process, pipe reader)] in rank order. port_args: rank 0's channels
    (node 0 only), every rank's with DP attention (each sends its own requests' news)."""
    from radixlm.scheduler.scheduler import run_scheduler_process

    started = []
    with fixed_hash_seed():
        for cpus, rank in zip(rank_cpus(dist), dist.node_ranks(), strict=True):
            reader, writer = ctx.Pipe(duplex=False)
            heartbeat, loop_heartbeat = new_heartbeat(ctx), new_heartbeat(ctx)
            spec = RankSpec(rank, dist, cpus, heartbeat)
            p = child_process(
                ctx,
                run_scheduler_process,
                (
                    config,
                    port_args if rank == 0 or dist.enable_dp_attention else None,
                    writer,
                    spec,
                    loop_heartbeat,
                ),
                name=f"scheduler rank {rank}",
            )
            p.heartbeat = heartbeat  # read by watch_processes / stop_processes
            p.loop_heartbeat = (
                loop_heartbeat  # beaten by the rank's scheduler loop (--watchdog-timeout)
            )
            p.start()
            started.append((p, reader))
    return started


def wait_ready(started: list[tuple], others: list = ()) -> list[dict]:
    """Each scheduler's ready report, in order; a StartupRefusalError with its one line when one
    refused its configuration (errors.py: start_failure_report), a RuntimeError naming the rank
    that failed or died (others: processes whose death also ends the wait, e.g. the
    detokenizer)."""
    infos: list[dict | None] = [None] * len(started)
    while any(i is None for i in infos):
        for k, (p, reader) in enumerate(started):
            if infos[k] is None and reader.poll(0.2):
                info = reader.recv()
                if info.get("status") == "refused":
                    raise StartupRefusalError(info["message"])
                if info.get("status") != "ready":
                    raise RuntimeError(f"the {p.name} failed to start: {info.get('message')}")
                infos[k] = info
            elif infos[k] is None and not p.is_alive():
                raise RuntimeError(
                    f"the {p.name} process died while starting (exit code {p.exitcode})"
                )
        for p in others:
            if not p.is_alive():
                raise RuntimeError(
                    f"the {p.name} process died while starting (exit code {p.exitcode})"
                )
    return infos  # type: ignore[return-value]
