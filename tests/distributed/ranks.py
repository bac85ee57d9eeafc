"""Run a function on N ranks of a real torch.distributed world (gloo on this host, one thread per
rank), as a tensor-parallel engine's ranks are: each rank joins with init_parallel_state, then
calls fn(rank, *args); the test gets every rank's return value. A rank that fails fails the test
with its traceback; no rank outlives the call."""

from __future__ import annotations

import queue
import socket
import traceback

from radixlm.distributed.config import DistConfig
from radixlm.engine.process_context import child_context


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank: int, dist: DistConfig, args: tuple, out) -> None:
    import torch

    from radixlm.distributed.parallel_state import destroy_parallel_state, init_parallel_state

    torch.set_num_threads(1)
    try:
        init_parallel_state(dist, rank)
        out.put((rank, "ok", fn(rank, *args)))
        destroy_parallel_state()
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn,
    tp: int,
    *args,
    backend: str = "gloo",
    timeout: float = 300.0,
    ep: int = 1,
    dp_attention: bool = False,
) -> list:
    """[fn's result on rank 0, rank 1, ...]; ep: expert parallelism (1 or tp); dp_attention: the tp
    ranks are DP-attention ranks (dp_size tp, attention groups of one)."""
    ctx = child_context()  # the engine's: ranks fork from a server that imported torch
    dist = DistConfig(
        tp_size=tp,
        dist_init_addr=f"127.0.0.1:{_free_port()}",
        allreduce_backend=backend,
        timeout=60,
        ep_size=ep,
        dp_size=tp if dp_attention else 1,
        enable_dp_attention=dp_attention,
    )
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, r, dist, args, out), daemon=True)
        for r in range(tp)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    try:
        for _ in range(tp):
            try:
                rank, status, value = out.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"ranks {sorted(set(range(tp)) - set(results))} did not finish in {timeout} s"
                ) from None
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(tp)]
