"""Ministral 3 (Ministral3ForCausalLM, the text model of the Ministral 3 checkpoints): Mistral's
graph (config.sliding_window on every layer where set) with YaRN RoPE and Llama 4's attention
temperature on every layer: after RoPE, q at position p is scaled by 1 + beta log(1 + floor(p /
original_max_position_embeddings)) (rope_parameters' llama_4_scaling_beta; llama.cpp's
attention.temperature_scale), 1 inside the original context."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.rotary import rope_parameters
from radixlm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from radixlm.model.models.seed_oss import check_silu


class Ministral3Attention(LlamaAttention):
    def __init__(self, config: Any, layer_id: int, rotary_emb):
        super().__init__(config, layer_id, rotary_emb, qkv_bias=False, qk_norm=False, o_bias=False)
        params = rope_parameters(config)
        self.beta = params.get("llama_4_scaling_beta")
        self.floor_scale = params.get("original_max_position_embeddings")
        if self.beta is None or not self.floor_scale:
            raise ValueError(
                "Ministral3 rope_parameters need llama_4_scaling_beta and"
                f" original_max_position_embeddings, got {params}"
            )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        scale = 1 + self.beta * torch.log1p(torch.floor(positions.float() / self.floor_scale))
        q = q * scale.to(q.dtype)[:, None]
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Ministral3ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        check_silu(config)

        def layer(i: int, rope) -> nn.Module:
            attn = Ministral3Attention(config, i, rope)
            return LlamaDecoderLayer(config, i, rope, self_attn=attn)

        # (the one-op decoder has no attention temperature: it takes LlamaAttention's layers only)
        return LlamaModel(config, build_layer=layer)
