"""gpt-oss's experts at one decode step, the two CPU paths side by side: one quantized matmul pair
per expert touched from Python (the path before the fused op, and the one off the CPU) against the
native fused_moe op with the biases and the clamped SwiGLU (models/gpt_oss_moe.py). Random MXFP4
experts of gpt-oss-20b's shape (32 experts, top 4, hidden = intermediate = 2880), --layers of them
so the weights stream from memory; the paths alternate in one process.

    python benchmarks/gpt_oss_experts.py --tokens 1 8 --repeat 12
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixlm.model.layers.moe.experts import ExpertWeights  # noqa: E402 (after the sys.path insert above)
from radixlm.model.models.gpt_oss_moe import GptOssExperts  # noqa: E402 (after the sys.path insert above)


def layer(cfg, fused: bool, g: torch.Generator) -> GptOssExperts:
    E, H, inter = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    m = GptOssExperts(cfg)
    m.gate_up_proj_bias.data = torch.randn(E, 2 * inter, generator=g) * 0.01
    m.down_proj_bias.data = torch.randn(E, H, generator=g) * 0.01
    w13 = torch.randn(E, 2 * inter, H, generator=g) * 0.02
    m.set_quantized("gate_up_proj", ExpertWeights.from_float(w13, "mxfp4"))
    w2 = torch.randn(E, H, inter, generator=g) * 0.02
    m.set_quantized("down_proj", ExpertWeights.from_float(w2, "mxfp4"))
    if fused:
        m.finish_loading()
        if not m.fused:
            sys.exit("the native fused_moe op is not available here")
    else:  # what finish_loading does where the op does not run
        m.quantized = {n: w.interleaved() for n, w in m.quantized.items()}
    return m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=12)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cfg = types.SimpleNamespace(
        num_local_experts=32, hidden_size=2880, intermediate_size=2880, num_experts_per_tok=4
    )
    g = torch.Generator().manual_seed(0)
    paths = {
        name: [layer(cfg, name == "fused", g) for _ in range(a.layers)]
        for name in ("per-expert", "fused")
    }
    print("| tokens | path | p50 ms per layer | min ms |\n|---|---|---|---|")
    for T in a.tokens:
        x = torch.randn(T, cfg.hidden_size, generator=g)
        times: dict[str, list[float]] = {n: [] for n in paths}
        for rep in range(a.repeat + 2):
            ids = torch.stack([torch.randperm(32, generator=g)[:4] for _ in range(T)])
            w = torch.rand(T, 4, generator=g).softmax(-1)
            for name, layers in paths.items():
                t0 = time.perf_counter()
                for m in layers:
                    m(x, w, ids)
                if rep >= 2:  # two warm-up rounds
                    times[name].append((time.perf_counter() - t0) / len(layers))
        for name, ts in times.items():
            print(f"| {T} | {name} | {statistics.median(ts) * 1e3:.2f} | {min(ts) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
