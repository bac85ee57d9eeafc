"""The fused MoE op alone (torch.ops.radixlm.fused_moe) against the torch path (fused_experts_torch:
one qlinear per expert touched from Python), on random weights of a MoE layer's shape: time per
call, the expert bytes a call reads (the distinct experts its tokens chose, gate+up and down) and
that as GB/s against the machine's memory bandwidth (a multi-threaded sum over a large buffer).

    python benchmarks/moe_kernel.py                        # OLMoE-1B-7B: hidden 2048, intermediate 1024, 64 experts, top-8
    python benchmarks/moe_kernel.py --w13-format q4_k --w2-format q8_0 --tokens 1 8 32
    python benchmarks/moe_kernel.py --hidden 256 --intermediate 256 --experts 8 --top-k 2 --repeat 3 --bw-mb 64  # a smoke run

Each call routes its tokens anew (a fresh random top-k per call, from a precomputed list), so the
experts read vary as in decode and the layer's experts (226 MB at Q4_K for OLMoE) come from memory,
not the cache. Weights are one expert quantized from random floats, copied to every expert (same
values, separate memory). Medians over --repeat calls after a warm-up.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixlm.kernels.formats import QUANTIZE_AT_LOAD  # noqa: E402 (after the sys.path insert above)
from radixlm.kernels.ops import ops  # noqa: E402 (after the sys.path insert above)
from radixlm.model.layers.moe.experts import ExpertWeights  # noqa: E402 (after the sys.path insert above)
from radixlm.model.layers.moe.fused_moe import fused_experts_torch  # noqa: E402 (after the sys.path insert above)
from radixlm.model.layers.quantized import QuantizedTensor  # noqa: E402 (after the sys.path insert above)


def stacked_experts(rows: int, cols: int, experts: int, fmt: str, parts: int) -> ExpertWeights:
    one = QuantizedTensor.quantize(torch.randn(rows, cols) * 0.05, fmt)
    data = torch.stack([one.data.clone() for _ in range(experts)])
    return ExpertWeights(data, one.fmt, rows, cols).interleaved(
        parts
    )  # as a loader would keep them


def median_us(fn, calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def memory_gbps(mb: float) -> float:
    buf = torch.ones(int(mb * 1e6 / 4))
    buf.sum()
    t = time.perf_counter()
    for _ in range(3):
        buf.sum()
    return 3 * buf.nbytes / (time.perf_counter() - t) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--w13-format", default="q4_k", choices=[f for f in QUANTIZE_AT_LOAD])
    p.add_argument("--w2-format", default="q4_k", choices=[f for f in QUANTIZE_AT_LOAD])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--bw-mb", type=float, default=1024.0, help="buffer of the bandwidth probe")
    p.add_argument("--no-torch", action="store_true", help="skip the torch path (slow at large T)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    H, I, E, k = a.hidden, a.intermediate, a.experts, a.top_k
    w13 = stacked_experts(2 * I, H, E, a.w13_format, parts=2)
    w2 = stacked_experts(H, I, E, a.w2_format, parts=1)
    per_expert = w13.data[0].nbytes + w2.data[0].nbytes
    bw = memory_gbps(a.bw_mb)
    g = torch.Generator().manual_seed(0)
    print(
        f"hidden {H}, intermediate {I}, {E} experts, top-{k}; w13 {w13.fmt.name}, w2 {w2.fmt.name}:"
        f" {per_expert / 1e6:.2f} MB per expert, {E * per_expert / 1e6:.0f} MB per layer;"
        f" {a.threads} threads; memory {bw:.1f} GB/s (sum over {a.bw_mb:.0f} MB)"
    )
    print(
        "| tokens | experts read | MB read | op us | op GB/s | of memory bw | torch path us | op"
        " speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for T in a.tokens:
        x = torch.randn(T, H, generator=g)
        routes = []
        for _ in range(a.repeat + 1):
            tw, ti = torch.topk(torch.randn(T, E, generator=g).softmax(-1), k)
            routes.append((tw, ti.to(torch.int32)))
        turn = iter(range(1 << 62))

        def native():
            tw, ti = routes[next(turn) % len(routes)]
            return ops().fused_moe(
                x, ti, tw, w13.data, w13.fmt.kernel_id, w2.data, w2.fmt.kernel_id
            )

        def torch_path():
            tw, ti = routes[next(turn) % len(routes)]
            return fused_experts_torch(x, tw, ti, w13, w2)

        read = statistics.mean(len(torch.unique(ti)) for _, ti in routes)
        us = median_us(native, a.repeat)
        mb = read * per_expert / 1e6
        torch_us = float("nan") if a.no_torch else median_us(torch_path, max(3, a.repeat // 4))
        print(
            f"| {T} | {read:.1f} | {mb:.1f} | {us:.0f} | {mb / 1e3 / (us / 1e6):.1f} | "
            f"{mb / 1e3 / (us / 1e6) / bw:.0%} | {torch_us:.0f} | {torch_us / us:.2f}x |"
        )


if __name__ == "__main__":
    main()
