"""One rank's process-level setup: which CPUs it runs on, its heartbeat, joining the world.

The launcher (engine/tp_launch.py) hands each rank process a RankSpec. The rank pins itself to
its share of this node's cores (os.sched_setaffinity: disjoint slices when there are enough
cores; torch then runs that many intra-op threads, or --num-threads) and beats a heartbeat in
shared memory from a thread, so the launcher tells a stopped or frozen rank from a busy one.

A heartbeat is a shared double holding time.monotonic() of the last beat (0: none expected yet).
The same kind, beaten once per loop iteration instead of from a thread, tells the launcher that the
scheduler's loop (and the detokenizer's) still makes progress (engine/launcher.py,
--watchdog-timeout).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.distributed.config import DistConfig

HEARTBEAT_INTERVAL = 0.5  # seconds between beats
HEARTBEAT_TIMEOUT = 4.0  # a rank silent this long is taken for hung (the launcher stops the group)


@dataclass
class RankSpec:
    rank: int  # global rank
    dist: DistConfig
    cpus: list[int] = field(default_factory=list)  # this rank's cores (empty: not pinned)
    heartbeat: Any = None  # multiprocessing.Value("d"): time.monotonic() of the last beat

    @property
    def local_rank(self) -> int:
        return self.rank - self.dist.node_rank * self.dist.ranks_per_node


def pin_cpus(cpus: list[int]) -> list[int] | None:
    """Run this process on `cpus` only (where the OS allows); the cores it got, or None."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return None
    return cpus


def new_heartbeat(ctx):
    """A heartbeat shared with a process started from the multiprocessing context ctx."""
    return ctx.Value("d", 0.0, lock=False)


def beat(value) -> None:
    """Record a beat now: time.monotonic(), one clock for every process of the host (None: no
    heartbeat)."""
    if value is not None:
        value.value = time.monotonic()


def start_heartbeat(value) -> None:
    """A daemon thread beating value every HEARTBEAT_INTERVAL seconds."""
    if value is None:
        return

    def run():
        while True:
            beat(value)
            time.sleep(HEARTBEAT_INTERVAL)

    beat(value)
    threading.Thread(target=run, name="radixlm-heartbeat", daemon=True).start()


def heartbeat_age(value) -> float:
    """Seconds since the last beat (0 while none is expected)."""
    if value is None or not value.value:
        return 0.0
    return time.monotonic() - value.value
