"""MLA (DeepSeek-V2/V3) on this machine: the latent KV cache's bytes per token against ordinary
per-head (MHA) caching, and decode throughput at batch sizes 1 / 8 / 32 with weight absorption
(the latent read once for all heads, the native mla_decode op) and without (every step
decompresses each request's latents into per-head K/V through kv_b_proj).

    python benchmarks/mla.py                          # DeepSeek-V2-Lite's shape, 4 of its 27 layers
    python benchmarks/mla.py --layers 2 --experts 8 --ctx 64 --steps 3 --batch-sizes 1 2   # a smoke run

The model has random weights and DeepSeek-V2-Lite's dimensions (hidden 2048, 16 heads, kv_lora_rank
512, qk_rope 64, qk_nope 128, v 128, 64 routed experts top-6 + 2 shared, first layer dense), with
--layers of its 27 layers and --experts routed experts so that it fits in memory (float32; the
figures per layer scale to the full model). Each request has a --ctx-token context. Run it on an
otherwise idle machine; the figures go to docs/benchmarks.md.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 (after the sys.path insert above)

V2_LITE = dict(
    model_type="deepseek_v2",
    architectures=["DeepseekV2ForCausalLM"],
    vocab_size=102400,
    hidden_size=2048,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_shared_experts=2,
    n_routed_experts=64,
    num_experts_per_tok=6,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_rope_head_dim=64,
    v_head_dim=128,
    qk_nope_head_dim=128,
    first_k_dense_replace=1,
    topk_method="greedy",
    routed_scaling_factor=1.0,
    max_position_embeddings=163840,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
    },
)


def kv_bytes(layout, layers: int) -> dict:
    return {
        dt: {
            "mla": layout.bytes_per_token(layers, getattr(torch, dt)),
            "mha": layout.mha_bytes_per_token(layers, getattr(torch, dt)),
        }
        for dt in ("float32", "bfloat16")
    }


def decode_tok_s(loaded, bs: int, ctx: int, steps: int, absorb: bool) -> float:
    from tests.model.deepseek_refs import MLAHarness

    h = MLAHarness(
        loaded.model,
        loaded.hf_config,
        absorb=absorb,
        max_reqs=bs + 1,
        max_context=ctx + steps + 8,
        kv_size=bs * (ctx + steps + 8),
    )
    g = torch.Generator().manual_seed(0)
    reqs = [h.new_request() for _ in range(bs)]
    for r in reqs:  # one prefill each (the prefill is not what is measured)
        h.extend([r], [torch.randint(0, loaded.hf_config.vocab_size, (ctx,), generator=g).tolist()])
    tokens = [1] * bs
    h.decode(reqs, tokens)  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens = h.decode(reqs, tokens).argmax(-1).tolist()
    return bs * steps / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from radixlm.model.loader import load_model
    from radixlm.model.memory.kv_layout import kv_layout

    cfg = {
        **V2_LITE,
        "num_hidden_layers": args.layers,
        "n_routed_experts": args.experts,
        "num_experts_per_tok": min(6, args.experts),
    }
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg))
        loaded = load_model(str(path))  # a bare config: random weights
    layout = kv_layout(loaded.model, loaded.hf_config)
    report = {
        "shape": (
            f"DeepSeek-V2-Lite dims, {args.layers}/27 layers, {args.experts}/64 experts, float32"
        ),
        "kv_bytes_per_token_full_27_layers": kv_bytes(layout, 27),
        "kv_bytes_per_token_this_model": kv_bytes(layout, args.layers),
        "ctx": args.ctx,
        "decode_tok_s": {},
    }
    for bs in args.batch_sizes:
        for absorb in (True, False):
            tps = decode_tok_s(loaded, bs, args.ctx, args.steps, absorb)
            report["decode_tok_s"][f"bs{bs}_{'absorbed' if absorb else 'decompressed'}"] = round(
                tps, 2
            )
            print(
                f"bs {bs:3d} {'absorbed    ' if absorb else 'decompressed'}: {tps:9.2f} tok/s",
                flush=True,
            )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
