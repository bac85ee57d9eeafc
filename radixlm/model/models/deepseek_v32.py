"""DeepSeek-V3.2 (DeepseekV32ForCausalLM): DeepSeek-V3 with DeepSeek Sparse Attention, module
names as in the HF checkpoints (transformers 5.x's DeepseekV32 is the reference).

Each layer's MLA gets a lightning indexer (self_attn.indexer: wq_b, wk, k_norm, weights_proj;
layers/attention/nsa_indexer.py) whose per-token key the latent pool keeps beside the latent, and
each query attends only the index_topk cached tokens the indexer ranks highest
(layers/attention/nsa_attention.py). The rest (MoE, routing, MTP layers skipped) is V3's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention.nsa_attention import NSAAttention
from radixlm.model.layers.attention.nsa_indexer import NSAIndexer
from radixlm.model.models.deepseek_v2 import (
    DeepseekV2Attention,
    DeepseekV2Model,
    DeepseekV3ForCausalLM,
    mla_softmax_scale,
)


def check_config(config: Any) -> None:
    """A clear error naming the field a DeepSeek-V3.2 config lacks or gets wrong."""
    if not getattr(config, "q_lora_rank", None):
        raise ValueError(
            "DeepseekV32ForCausalLM: q_lora_rank must be set (the indexer's queries come from the"
            f" q LoRA), got {getattr(config, 'q_lora_rank', None)!r}"
        )
    for field in ("index_topk", "index_head_dim", "index_n_heads"):
        value = getattr(config, field, None)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(
                f"DeepseekV32ForCausalLM: {field} must be a positive int, got {value!r}"
            )
    if config.index_head_dim < config.qk_rope_head_dim:
        raise ValueError(
            f"DeepseekV32ForCausalLM: index_head_dim ({config.index_head_dim}) must be at least"
            f" qk_rope_head_dim ({config.qk_rope_head_dim}): RoPE turns that many of its dims"
        )


class DeepseekV32Attention(DeepseekV2Attention):
    """MLA whose queries attend the indexer's top-k cached tokens."""

    def __init__(self, config: Any, layer_id: int, rotary_emb: nn.Module, interleaved_rope: bool):
        super().__init__(config, layer_id, rotary_emb, interleaved_rope)
        self.indexer = NSAIndexer(config, rotary_emb)

    def build_attn(self, config: Any, layer_id: int) -> NSAAttention:
        return NSAAttention(
            self.num_heads,
            self.nope,
            self.rope,
            self.v_head_dim,
            self.kv_lora_rank,
            mla_softmax_scale(config),
            layer_id,
            self._kv_b_weight,
            config.index_head_dim,
            config.index_topk,
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        t = hidden.shape[0]
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden))  # the indexer's input too
        q = self.q_b_proj(q_resid).view(t, self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        kv_a = self.kv_a_proj_with_mqa(hidden)
        latent = self.kv_a_layernorm(kv_a[:, : self.kv_lora_rank].contiguous())
        q_pe = self._deinterleave(q_pe).reshape(t, self.num_heads * self.rope)
        k_pe = self._deinterleave(kv_a[:, self.kv_lora_rank :])
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        q = torch.cat((q_nope, q_pe.view(t, self.num_heads, self.rope)), dim=-1)
        index = self.indexer(positions, hidden, q_resid)
        o = self.attn(q, torch.cat((latent, k_pe), dim=-1), forward_batch, index)
        return self.o_proj(o)


class DeepseekV32Model(DeepseekV2Model):
    attn_cls = DeepseekV32Attention


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        check_config(config)
        return DeepseekV32Model(config, self.v3)
