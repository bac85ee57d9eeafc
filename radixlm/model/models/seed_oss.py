"""Seed-OSS (SeedOssForCausalLM): the Llama graph with q/k/v biases (attention_bias), its own
switch for the o_proj bias (attention_out_bias) and the MLP's (mlp_bias). Its dropouts are
training-only."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
)


def check_silu(config: Any) -> None:
    """Llama's MLP: SiLU-gated (the family's hidden_act must say so)."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        name = config.architectures[0] if getattr(config, "architectures", None) else "model"
        raise ValueError(f"{name} hidden_act {act!r}: radixlm runs 'silu'")


class SeedOssForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        check_silu(config)
        qkv_bias, o_bias = bool(config.attention_bias), bool(config.attention_out_bias)
        mlp_bias = bool(getattr(config, "mlp_bias", False))

        def layer(i: int, rope) -> nn.Module:
            attn = LlamaAttention(config, i, rope, qkv_bias, qk_norm=False, o_bias=o_bias)
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size, bias=mlp_bias)
            return LlamaDecoderLayer(config, i, rope, self_attn=attn, mlp=mlp)

        return LlamaModel(config, build_layer=layer)
