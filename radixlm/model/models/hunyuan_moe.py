"""Hunyuan-A13B (HunYuanMoEV1ForCausalLM; transformers' modeling_hunyuan_v1_moe is the reference).

The Llama graph (pre-norm, fused residual) with:
- attention: RMSNorm over each head of q and k *after* RoPE (query_layernorm / key_layernorm;
  Qwen3 norms before), q/k/v/o bias when attention_bias;
- RoPE "dynamic" with an `alpha` (the released config): NTK-aware scaling with a fixed alpha, i.e.
  a static base rope_theta * alpha ** (head_dim / (head_dim - 2)) (HF's ntk_alpha), which
  llama.cpp's converter writes as the plain base too;
- every layer a MoE: softmax router (`mlp.gate.wg`), top-k renormalized (DeepSeek's greedy routing
  with norm_topk_prob), experts of width intermediate_size, plus one always-on shared MLP
  (`mlp.shared_mlp`) of the same width: deepseek_moe.py's DeepseekMoE on GLM-4.5's stack.

The original checkpoints' per-layer lists (num_experts, moe_topk, moe_intermediate_size,
num_shared_expert) are read where uniform and equal to what transformers runs; cross-layer
attention (use_cla) and MLA (use_mla) are refused.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.rotary import RotaryEmbedding, rope_parameters
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.glm4_moe import Glm4MoeForCausalLM
from radixlm.model.models.llama import LlamaAttention, LlamaMLP, get_head_dim
from radixlm.model.models.moe import MoeDecoderLayer

_RENAMES = (
    (re.compile(r"\.self_attn\.query_layernorm\."), ".self_attn.q_norm."),
    (re.compile(r"\.self_attn\.key_layernorm\."), ".self_attn.k_norm."),
    (re.compile(r"\.mlp\.gate\.wg\."), ".mlp.gate."),
    (re.compile(r"\.mlp\.shared_mlp\."), ".mlp.shared_experts."),
)


def _uniform(config: Any, key: str, want: Any = None) -> Any:
    """A per-layer list's one value (or the scalar); refused when the layers differ or when it
    is not `want`."""
    value = getattr(config, key, None)
    values = set(value) if isinstance(value, (list, tuple)) else {value}
    if len(values) > 1 or (want is not None and values != {want}):
        raise ValueError(
            f"hunyuan_v1_moe: {key} {value!r} is not supported"
            + (f" (only {want} in every layer)" if want is not None else " (differs per layer)")
        )
    return values.pop()


def check_hunyuan_moe_config(config: Any) -> None:
    """A variant this module would run wrongly: refused in one line naming the field."""
    for key in ("use_cla", "use_mla"):
        if getattr(config, key, False):
            raise ValueError(f"hunyuan_v1_moe: {key} true is not supported")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hunyuan_v1_moe: hidden_act {config.hidden_act!r} is not supported")
    _uniform(config, "num_experts")
    _uniform(config, "moe_topk")
    if getattr(config, "moe_intermediate_size", None) is not None:
        _uniform(config, "moe_intermediate_size", config.intermediate_size)
    if getattr(config, "num_shared_expert", None) is not None:
        _uniform(config, "num_shared_expert", 1)


def resolve_ntk_alpha(config: Any) -> None:
    """HF's ntk_alpha RoPE ("dynamic" with an alpha) as the static base it is (config changed in
    place); "dynamic" without alpha (length-dependent NTK) is refused."""
    params = rope_parameters(config)
    if params["rope_type"] != "dynamic":
        return
    if not params.get("alpha"):
        raise ValueError("hunyuan_v1_moe: rope_parameters dynamic without alpha is not supported")
    dim = get_head_dim(config)
    base = params["rope_theta"] * params["alpha"] ** (dim / (dim - 2))
    config.rope_parameters = {"rope_type": "default", "rope_theta": base}


def routing_config(config: Any) -> SimpleNamespace:
    """The DeepSeek config fields DeepseekMoE reads, as HunYuan's router sets them."""
    return SimpleNamespace(
        n_routed_experts=_uniform(config, "num_experts"),
        num_experts_per_tok=_uniform(config, "moe_topk"),
        hidden_size=config.hidden_size,
        moe_intermediate_size=config.intermediate_size,
        topk_method="greedy",
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
    )


class HunYuanAttention(LlamaAttention):
    """Llama attention whose per-head q/k RMSNorms come after RoPE."""

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_dim)).view(-1, self.q_size)
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim)).view(-1, self.kv_size)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class HunYuanMoEV1ForCausalLM(Glm4MoeForCausalLM):
    weight_renames = _RENAMES

    def build_model(self, config: Any) -> nn.Module:
        check_hunyuan_moe_config(config)
        resolve_ntk_alpha(config)
        return super().build_model(config)

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        attn = HunYuanAttention(
            config, layer_id, rotary_emb, qkv_bias=bias, qk_norm=True, o_bias=bias
        )
        shared = LlamaMLP(config.hidden_size, config.intermediate_size)
        mlp = DeepseekMoE(routing_config(config), False, shared, self.expert_dispatch)
        return MoeDecoderLayer(config, attn, mlp)
