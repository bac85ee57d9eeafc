"""The linear layers of one Llama-3-8B decode step (32 x qkv, o, gate_up, down), captured in one
CUDA graph and replayed, by GEMM path: bf16 through cuBLAS and through cuBLASLt (torch's
preferred_blas_library), FP8 weights through radixlm's Triton W8A16 GEMM (Fp8Matrix, tuned first),
and FP8 weights and activations through torch._scaled_mm (a per-token activation scale, M padded to
16: vLLM's W8A8 path). Prints, per M, each path's ms per step and weight bytes over time: what the
GEMMs alone cost inside a decode graph, where launch gaps are gone (issue 67: the bf16 batch-64
goal and the FP8 roofline).

Usage (on a GPU): python3 benchmarks/gpu_gemm_probe.py [--m 1 64] [--layers 32] [--output-file F]
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
import torch.nn.functional as F

from radixlm.model.layers.fp8_linear import Fp8Matrix

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate_up, down
E4M3_MAX = 448.0


def graph_ms(fn, reps: int = 20) -> float:
    fn()  # warm-up (and the Triton GEMM's tuning) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def scaled_mm(x: torch.Tensor, q_t: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """W8A8: x quantized per token (row scale), q_t the [K, N] column-major FP8 weight."""
    m = x.shape[0]
    pad = (-m) % 16
    xp = F.pad(x, (0, 0, 0, pad)) if pad else x
    s = (xp.abs().amax(-1, keepdim=True).float() / E4M3_MAX).clamp(min=1e-12)
    xq = (xp / s).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(xq, q_t, scale_a=s, scale_b=w_scale, out_dtype=torch.bfloat16)
    return out[:m]


def bf16_step(ws, xs):
    return [F.linear(xs[w.shape[1]], w) for layer in ws for w in layer]


def fp8_step(fp8, xs):
    return [q.matmul(xs[q.cols]) for layer in fp8 for q in layer]


def scaled_mm_step(mm, xs):
    return [scaled_mm(xs[t.shape[0]], t, s) for layer in mm for t, s in layer]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--output-file")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    ws = [
        [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for n, k in SHAPES]
        for _ in range(args.layers)
    ]
    fp8 = [[Fp8Matrix.quantize(w) for w in layer] for layer in ws]
    # _scaled_mm's operands: the same FP8 weight, transposed (column-major), its scale as [1, N].
    mm = [[(m.q.t(), m.scale.float().view(1, -1)) for m in layer] for layer in fp8]
    bf16_bytes = sum(w.nbytes for layer in ws for w in layer)
    fp8_bytes = sum(m.nbytes for layer in fp8 for m in layer)
    rows = []
    for m in args.m:
        xs = {k: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _, k in SHAPES}
        paths = {
            "bf16 cublas": (partial(bf16_step, ws, xs), bf16_bytes, "cublas"),
            "bf16 cublaslt": (partial(bf16_step, ws, xs), bf16_bytes, "cublaslt"),
            "fp8 triton w8a16": (partial(fp8_step, fp8, xs), fp8_bytes, "cublas"),
            "fp8 scaled_mm w8a8": (partial(scaled_mm_step, mm, xs), fp8_bytes, "cublas"),
        }
        for name, (fn, nbytes, blas) in paths.items():
            try:
                torch.backends.cuda.preferred_blas_library(blas)
                ms = graph_ms(fn)
                row = {"m": m, "path": name, "ms_per_step": ms, "gbps": nbytes / ms / 1e6}
            except Exception as e:  # a path the machine's torch lacks: say so, go on
                row = {"m": m, "path": name, "error": f"{type(e).__name__}: {e}"[:200]}
            finally:
                torch.backends.cuda.preferred_blas_library("cublas")
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.output_file:
        with open(args.output_file, "a") as f:
            for r in rows:
                f.write(json.dumps({"gemm_probe": True, **r}) + "\n")


if __name__ == "__main__":
    main()
