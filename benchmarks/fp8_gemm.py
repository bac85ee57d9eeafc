"""The FP8 e4m3 linear kernel (compressed-tensors checkpoints: kernels/formats.py fp8_e4m3) beside
bfloat16 and Q8_0 on one matrix past the caches: time per call and weight bytes per second, the
formats' calls alternating so that the machine's noise falls on all alike.

    python benchmarks/fp8_gemm.py --shape 8192 4096 --rows 1 8 64 --repeat 15

Figures: min and median over --repeat calls of each (after one warm-up call).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixlm.kernels import build  # noqa: E402 (after the sys.path insert above)
from radixlm.kernels.formats import FORMATS, quantize  # noqa: E402 (after the sys.path insert above)

NAMES = ("bf16", "fp8_e4m3", "q8_0")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=2, default=[8192, 4096], metavar=("N", "K"))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    if not build.load():
        sys.exit(f"the native kernels are not available: {build.unavailable_reason()}")
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(*a.shape, generator=g)
    weights = {n: quantize(w, n) for n in NAMES}
    print("| rows | format | MiB | min ms | p50 ms | GB/s at min |\n|---|---|---|---|---|---|")
    for m in a.rows:
        x = torch.randn(m, a.shape[1], generator=g)
        times: dict[str, list[float]] = {n: [] for n in NAMES}
        for rep in range(a.repeat + 1):
            for n, q in weights.items():
                t0 = time.perf_counter()
                torch.ops.radixlm.qlinear(x, q, FORMATS[n].kernel_id, None)
                if rep:  # the first call of each warms up
                    times[n].append(time.perf_counter() - t0)
        for n, ts in times.items():
            ts.sort()
            mib = weights[n].numel() / 2**20
            print(
                f"| {m} | {n} | {mib:.1f} | {ts[0] * 1e3:.2f} | {ts[len(ts) // 2] * 1e3:.2f} |"
                f" {weights[n].numel() / ts[0] / 1e9:.1f} |"
            )


if __name__ == "__main__":
    main()
