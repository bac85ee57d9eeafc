"""A hybrid model's memory beside an all-attention model of the same size: state bytes per
request, KV bytes per token, and the longest prompt one request can hold in a budget.

    python benchmarks/hybrid_memory.py --budget-gib 4

The shapes are HF configs (Qwen3.5-0.8B's text config and the same decoder with every layer full
attention); radixlm's own model classes are built on the meta device (no weights) and its pools'
formulas give the bytes: KV in float16 (what quantized GGUF weights run with on CPU), states in
float32 (--mamba-ssm-dtype's default). The KV pool holds the attention layers only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Qwen/Qwen3.5-0.8B's text_config (config.json).
QWEN3_5_0_8B = dict(
    vocab_size=248320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    max_position_embeddings=262144,
    tie_word_embeddings=True,
)


def figures(model, kv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> tuple[int, int]:
    """(KV bytes per token, state bytes per request) of radixlm's model."""
    from radixlm.cache.memory_pool import TokenToKVPool
    from radixlm.cache.state_pool import MambaPool
    from radixlm.model.layers.attention import RadixAttention

    attn = [m for m in model.modules() if isinstance(m, RadixAttention)]
    per_token = TokenToKVPool.bytes_per_token(
        len(attn), attn[0].num_kv_heads, attn[0].head_dim, kv_dtype
    )
    specs = model.state_specs(torch.float32, ssm_dtype) if hasattr(model, "state_specs") else []
    return per_token, MambaPool.bytes_per_state(specs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget-gib", type=float, default=4.0)
    args = p.parse_args()
    from transformers import Qwen3_5TextConfig, Qwen3Config

    from radixlm.model.models.qwen3 import Qwen3ForCausalLM
    from radixlm.model.models.qwen3_5 import Qwen3_5ForCausalLM

    hybrid_cfg = Qwen3_5TextConfig(**QWEN3_5_0_8B)
    dense_cfg = Qwen3Config(
        **{k: v for k, v in QWEN3_5_0_8B.items() if not k.startswith("linear_")}
    )
    budget = int(args.budget_gib * 2**30)
    gib = f"{args.budget_gib:g} GiB"
    print(f"| model | KV bytes/token | state bytes/request | longest prompt in {gib} |")
    print("|---|---|---|---|")
    for name, cls, cfg in [
        ("Qwen3.5-0.8B (18 Gated DeltaNet + 6 attention layers)", Qwen3_5ForCausalLM, hybrid_cfg),
        ("the same decoder, 24 attention layers", Qwen3ForCausalLM, dense_cfg),
    ]:
        with torch.device("meta"):
            model = cls(cfg)
        per_token, per_state = figures(model, torch.float16, torch.float32)
        longest = (budget - per_state) // per_token
        state = f"{per_state:,} ({per_state / 2**20:.1f} MiB)"
        print(f"| {name} | {per_token:,} | {state} | {longest:,} |")


if __name__ == "__main__":
    main()
