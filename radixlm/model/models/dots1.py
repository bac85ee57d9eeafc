"""dots.llm1 (Dots1ForCausalLM; transformers' modeling_dots1 is the reference): GLM-4.5's stack
(glm4_moe.py: dense MLPs for the first first_k_dense_replace layers, then DeepSeek-V3's MoE with
sigmoid scores + e_score_correction_bias, grouped top-k, shared experts) under Qwen3's attention:
RMSNorm over each head of q and k, always, and full RoPE. attention_bias, when set, is on all four
projections (o_proj too, unlike GLM). Sliding-window layers (layer_types) are refused: the
released models have none (max_window_layers = num_hidden_layers)."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.glm4_moe import Glm4MoeForCausalLM
from radixlm.model.models.llama import LlamaAttention


def check_dots1_config(config: Any) -> None:
    """A variant this module would run wrongly: refused in one line naming the field."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(
            f"dots1: layer_types {sorted(kinds)} is not supported (sliding-window layers;"
            " only full_attention)"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"dots1: hidden_act {config.hidden_act!r} is not supported (only silu)")
    if not config.n_routed_experts:
        raise ValueError("dots1: n_routed_experts must be set (a MoE model)")


class Dots1ForCausalLM(Glm4MoeForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        check_dots1_config(config)
        return super().build_model(config)

    def build_attention(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return LlamaAttention(
            config, layer_id, rotary_emb, qkv_bias=bias, qk_norm=True, o_bias=bias
        )
