"""Hunyuan dense (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B to 7B): the Llama graph with HunYuan's
attention (models/hunyuan_moe.py: per-head q/k RMS norms, query_layernorm / key_layernorm, after
RoPE) and its NTK-alpha RoPE ("dynamic" with an `alpha`: a fixed stretched base, which is how
llama.cpp's converter writes it too); q/k/v/o biases where attention_bias."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.models.hunyuan_moe import HunYuanAttention, resolve_ntk_alpha
from radixlm.model.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from radixlm.model.models.seed_oss import check_silu


class HunYuanDenseV1ForCausalLM(LlamaForCausalLM):
    NORMS = {".query_layernorm.": ".q_norm.", ".key_layernorm.": ".k_norm."}

    def build_model(self, config: Any) -> nn.Module:
        check_silu(config)
        resolve_ntk_alpha(config)
        bias = bool(getattr(config, "attention_bias", False))

        def layer(i: int, rope) -> nn.Module:
            attn = HunYuanAttention(config, i, rope, qkv_bias=bias, qk_norm=True, o_bias=bias)
            return LlamaDecoderLayer(config, i, rope, self_attn=attn)

        return LlamaModel(config, build_layer=layer)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        for hf, ours in self.NORMS.items():
            name = name.replace(hf, ours)
        return super()._map_name(name)
