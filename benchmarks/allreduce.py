"""Per-call and per-decode-step all-reduce time of a tensor-parallel group on this host: gloo
(torch.distributed) against the shared-memory all-reduce (radixlm/distributed/shm_communicator.py).

    python benchmarks/allreduce.py                      # 2 ranks, the default sizes
    python benchmarks/allreduce.py --ranks 2 --hidden 576 2048 4096 --tokens 1 16 256 --iters 2000

Each rank is a process with one torch thread (the ranks of `serve --tp-size N` on this machine's
cores). A step of a Llama-family model all-reduces twice per layer (o_proj, down_proj) plus once for
the embedding: `per step` is that count times the per-call time for --layers layers.
Run it on an otherwise idle machine; the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 (after the sys.path insert above)

from tests.distributed.ranks import run_ranks  # noqa: E402 (after the sys.path insert above)


def _time(rank: int, shapes: list[tuple[int, int]], iters: int, warmup: int) -> dict:
    from radixlm.distributed.parallel_state import get_tp_group

    comm = get_tp_group().device_comm
    out = {}
    for tokens, hidden in shapes:
        x = torch.randn(tokens, hidden)
        for _ in range(warmup):
            comm.all_reduce(x)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(x)
        out[(tokens, hidden)] = (time.perf_counter() - t0) / iters
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, nargs="+", default=[576, 2048, 4096])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512])
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument(
        "--layers", type=int, default=30, help="layers of the model a step runs (SmolLM2-135M: 30)"
    )
    p.add_argument("--backends", nargs="+", default=["gloo", "shm"])
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    shapes = [(t, h) for h in a.hidden for t in a.tokens]
    rows = []
    for backend in a.backends:
        res = run_ranks(_time, a.ranks, shapes, a.iters, a.warmup, backend=backend, timeout=3600)
        for key in res[0]:
            secs = max(r[key] for r in res)  # the slowest rank sets the pace
            rows.append(
                {
                    "backend": backend,
                    "shape": f"{key[0]}x{key[1]}",
                    "bytes": 4 * key[0] * key[1],
                    "us_per_call": secs * 1e6,
                    "ms_per_step": secs * (2 * a.layers + 1) * 1e3,
                }
            )
    if a.json:
        print(json.dumps(rows))
        return
    print(f"{a.ranks} ranks, 1 thread each; per step = {2 * a.layers + 1} all-reduces")
    print(f"{'backend':8} {'tokens x hidden':>16} {'KiB':>9} {'us/call':>10} {'ms/step':>9}")
    for r in rows:
        print(
            f"{r['backend']:8} {r['shape']:>16} {r['bytes'] / 1024:9.1f} {r['us_per_call']:10.1f} "
            f"{r['ms_per_step']:9.2f}"
        )


if __name__ == "__main__":
    main()
