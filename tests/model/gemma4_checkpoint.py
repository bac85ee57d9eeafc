"""A tiny random float32 Gemma 4 checkpoint (HF Gemma4ForCausalLM) for the model and cache tests:
6 layers alternating sliding (window WINDOW, 16-dim heads over 2 KV heads) and global attention
(32-dim heads over 1 KV head, proportional RoPE), soft-capped logits, and the layers' output
scalars drawn (HF leaves them at 1, where a missed one would not show). The layouts of the released
models are options: `dense` (the E2B / E4B one) and `moe` (the 26B-A4B one)."""

from __future__ import annotations

import torch
import transformers

from tests.model.windowed_checkpoints import WINDOW, checkpoint

LAYER_TYPES = ["sliding_attention", "full_attention"] * 3

# KV shared by the last two layers, V = K on the global layers, per-layer inputs, the shared
# layers' MLP twice as wide.
DENSE = dict(
    num_kv_shared_layers=2,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=8,
    use_double_wide_mlp=True,
)
# Routed GELU experts beside every layer's MLP, own V projections, no per-layer inputs.
MOE = dict(
    hidden_size_per_layer_input=0,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
)


def _draw_layer_scalars(hf: transformers.PreTrainedModel) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))


def gemma4_checkpoint(path: str, **config) -> transformers.PreTrainedModel:
    """The model saved at path with the tiny tokenizer; returns transformers' model. config: the
    layout (DENSE, MOE) and any override."""
    return checkpoint(
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        path,
        init=_draw_layer_scalars,
        **{
            "num_hidden_layers": 6,
            "layer_types": LAYER_TYPES,
            "head_dim": 16,
            "global_head_dim": 32,
            "num_global_key_value_heads": 1,
            "sliding_window": WINDOW,
            "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh",
            **config,
        },
    )
