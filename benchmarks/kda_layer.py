"""Kimi Delta Attention on the CPU: the layer (projections, conv, gates, the rule, norm, o_proj) and
the rule alone, per linear-attention backend, at Kimi-Linear-48B-A3B's KDA shape (transformers'
KimiLinearConfig defaults: hidden 2304, 32 heads x 128, conv 4); plus the question a chunked
native kernel would answer: the rule as the native token scan vs torch's chunk-parallel form
(kda_chunked) and vs the matmuls alone that any chunked form of it must run (a floor).

    python benchmarks/kda_layer.py                                  # decode at batch 1 and 8, prefill 512
    python benchmarks/kda_layer.py --hidden 256 --heads 2 --prefill 40 --repeat 3   # a smoke run

Random weights (float32, --quantization none's layer), float32 states; a decode step's states
start non-zero (a prefill ran before). The fastest of --repeat calls after a warm-up (x 10 for
decode).
"""  # noqa: E501 (command lines kept whole)

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixlm.cache.state_pool import MambaPool  # noqa: E402 (after the sys.path insert above)
from radixlm.model.forward_batch import ForwardMode  # noqa: E402 (after the sys.path insert above)
from radixlm.model.layers.linear_attn import create_linear_attn_backend  # noqa: E402
from radixlm.model.layers.linear_attn.kda_rule import kda_chunked  # noqa: E402
from radixlm.model.layers.linear_attn.kimi_delta_attention import KimiDeltaAttention  # noqa: E402


def best_ms(fn, calls: int) -> float:
    """The fastest of `calls` after a warm-up: on a shared machine the least disturbed call (a
    median follows the other jobs' load)."""
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def make_layer(args) -> KimiDeltaAttention:
    config = SimpleNamespace(
        hidden_size=args.hidden,
        linear_num_heads=args.heads,
        linear_head_dim=args.head_dim,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    layer = KimiDeltaAttention(config, 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
        layer.A_log.uniform_(0, 2.7)  # HF's init: A in [1, 16]
    return layer.eval()


def forward_batch(pool, backend, lens: list[int], decode: bool):
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        batch_size=len(lens),
        extend_seq_lens_cpu=lens,
        req_pool_indices=torch.arange(len(lens)),
        state_pool=pool,
        linear_attn_backend=backend,
        state_tracks=None,
    )


def rule_inputs(n: int, h: int, d: int):
    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(n, h, d, generator=g), dim=-1) * d**-0.5
    k = torch.nn.functional.normalize(torch.randn(n, h, d, generator=g), dim=-1)
    v = torch.randn(n, h, d, generator=g)
    gate = -torch.nn.functional.softplus(torch.randn(n, h, d, generator=g))
    return q, k, v, gate, torch.rand(n, h, generator=g)


def layer_times(args, layer, name: str) -> dict[str, float]:
    backend = create_linear_attn_backend(name, torch.device("cpu"))
    batch = max(args.decode_batch)
    pool = MambaPool([layer.state_specs(torch.float32, torch.float32)], batch, 0)
    out = {}
    with torch.no_grad():
        x = torch.randn(args.prefill, args.hidden) * 0.5
        fb = forward_batch(pool, backend, [args.prefill], decode=False)
        out[f"layer prefill {args.prefill}"] = best_ms(lambda: layer(x, fb), args.repeat)
        for bs in args.decode_batch:
            fb = forward_batch(pool, backend, [1] * bs, decode=True)
            x = torch.randn(bs, args.hidden) * 0.5
            out[f"layer decode bs={bs}"] = best_ms(lambda: layer(x, fb), args.repeat * 10)
        state = pool.layer(0)["ssm"]
        q, k, v, g, beta = rule_inputs(args.prefill, args.heads, args.head_dim)
        rows = torch.tensor([0])
        rule = lambda: backend.kimi_delta_rule(q, k, v, g, beta, state, rows, [args.prefill])
        out[f"rule prefill {args.prefill}"] = best_ms(rule, args.repeat)
        for bs in args.decode_batch:
            qd, kd, vd, gd, bd = rule_inputs(bs, args.heads, args.head_dim)
            rows = torch.arange(bs)
            step = lambda: backend.kimi_delta_rule(qd, kd, vd, gd, bd, state, rows, [1] * bs)
            out[f"rule decode bs={bs}"] = best_ms(step, args.repeat * 10)
    return out


def chunked_floor_ms(args, chunk: int) -> float:
    """The matmuls a chunk-parallel KDA runs per chunk (heads batched): q @ S, w @ S, the intra-
    chunk [c, c] products with v_new, k^T @ v_new into the state, and the triangular solve; none of
    the [c, c, Dk] decays, exps or copies. No chunked form of the rule can cost less."""
    h, d, n = args.heads, args.head_dim, args.prefill
    g = torch.Generator().manual_seed(2)
    qc, wc, kc = (torch.randn(h, chunk, d, generator=g) for _ in range(3))
    state = torch.randn(h, d, d, generator=g)
    tri = torch.eye(chunk).expand(h, chunk, chunk) + torch.randn(h, chunk, chunk).tril(-1) * 0.01
    rhs = torch.randn(h, chunk, 2 * d, generator=g)

    def one_chunk():
        solved = torch.linalg.solve_triangular(tri, rhs, upper=False, unitriangular=True)
        v_new = solved[..., :d] - wc @ state
        qk = qc @ kc.transpose(1, 2)
        _ = qc @ state + qk @ v_new
        _ = state + kc.transpose(1, 2) @ v_new

    chunks = (n + chunk - 1) // chunk
    return best_ms(lambda: [one_chunk() for _ in range(chunks)], args.repeat)


def scan_vs_chunked(args) -> dict[str, float]:
    h, d, n = args.heads, args.head_dim, args.prefill
    q, k, v, g, beta = rule_inputs(n, h, d)
    native = create_linear_attn_backend("native", torch.device("cpu"))
    state = torch.zeros(1, h, d, d)
    rows = torch.tensor([0])
    out = {
        "native token scan": best_ms(
            lambda: native.kimi_delta_rule(q, k, v, g, beta, state, rows, [n]), args.repeat
        )
    }
    for chunk in (32, 64):
        s0 = torch.zeros(h, d, d)
        out[f"torch kda_chunked c={chunk}"] = best_ms(
            lambda: kda_chunked(q, k, v, g, beta, s0.clone(), chunk), args.repeat
        )
        out[f"chunked matmul floor c={chunk}"] = chunked_floor_ms(args, chunk)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=2304)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode-batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--backends", nargs="+", default=["torch", "native"])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    shape = f"KDA {args.heads} x {args.head_dim}, hidden {args.hidden}"
    print(f"threads {torch.get_num_threads()}; {shape}")
    layer = make_layer(args)
    results = {name: layer_times(args, layer, name) for name in args.backends}
    base = results[args.backends[0]]
    for what in base:
        cells = "  ".join(f"{name} {results[name][what]:9.3f} ms" for name in args.backends)
        ratio = base[what] / results[args.backends[-1]][what]
        print(f"{what:22s} {cells}   {args.backends[0]}/{args.backends[-1]} {ratio:5.2f}x")
    print(f"rule over {args.prefill} tokens, one request, from a zero state:")
    for what, ms in scan_vs_chunked(args).items():
        print(f"  {what:28s} {ms:9.3f} ms")


if __name__ == "__main__":
    main()
