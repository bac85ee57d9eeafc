"""This machine's read rate buffer by buffer: --buffers buffers of 256 MiB, each summed --repeat
times (the fastest kept), in GB/s. On the 2-core VMs these benchmarks run on, one buffer's rate can
differ 2x from the next one's in the same process, and all of them between processes (the host's
memory behind the guest's pages): read a decode figure against the rate measured in its process.

    python benchmarks/read_rate.py --buffers 16 --rounds 2
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--buffers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    nbytes = 256 * 2**20
    bufs = [torch.ones(nbytes // 4) for _ in range(a.buffers)]
    for r in range(a.rounds):
        rates = []
        for b in bufs:
            best = float("inf")
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                b.sum()
                best = min(best, time.perf_counter() - t0)
            rates.append(nbytes / best / 1e9)
        print(f"round {r + 1}: " + " ".join(f"{v:.0f}" for v in rates) + " GB/s")


if __name__ == "__main__":
    main()
