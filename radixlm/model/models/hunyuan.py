"""Hunyuan dense (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B to 7B): the Llama graph whose per-head
q/k RMS norms (query_layernorm / key_layernorm) come after RoPE, not before it as Qwen3's; RoPE
"dynamic" with an `alpha` is HF's fixed NTK-alpha stretch of the base (theta * alpha^(D / (D -
2)), the same at every length), which is how llama.cpp's converter writes it too."""

from __future__ import annotations

import copy
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
    get_head_dim,
)
from radixlm.model.models.seed_oss import check_silu


class HunYuanAttention(LlamaAttention):
    """Per-head q/k norms after the rotation."""

    def __init__(self, config: Any, layer_id: int, rotary_emb):
        super().__init__(config, layer_id, rotary_emb, qkv_bias=False, qk_norm=True)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_dim)).view(-1, self.q_size)
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim)).view(-1, self.kv_size)
        return self.o_proj(self.attn(q, k, v, forward_batch))


def ntk_alpha_config(config: Any) -> Any:
    """config with HF's ntk_alpha RoPE (rope_type dynamic with an alpha) as the plain RoPE of the
    stretched base; config itself where there is no alpha."""
    params = rope_parameters(config)
    if params["rope_type"] != "dynamic" or not params.get("alpha"):
        return config
    dim = get_head_dim(config)
    base = params["rope_theta"] * params["alpha"] ** (dim / (dim - 2))
    config = copy.copy(config)
    config.rope_parameters = {"rope_type": "default", "rope_theta": base}
    return config


class HunYuanDenseV1ForCausalLM(LlamaForCausalLM):
    NORMS = {".query_layernorm.": ".q_norm.", ".key_layernorm.": ".k_norm."}

    def build_model(self, config: Any) -> nn.Module:
        check_silu(config)
        config = ntk_alpha_config(config)

        def layer(i: int, rope) -> nn.Module:
            return LlamaDecoderLayer(config, i, rope, self_attn=HunYuanAttention(config, i, rope))

        return LlamaModel(config, build_layer=layer)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        for hf, ours in self.NORMS.items():
            name = name.replace(hf, ours)
        return super()._map_name(name)
