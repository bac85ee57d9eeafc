"""Mixture-of-experts families (HF's modeling files are the reference; moe.py the shared stack):

Qwen2MoeForCausalLM   bias on q/k/v; softmax top-k not renormalized (norm_topk_prob False); a
                      shared expert (shared_expert_intermediate_size) scaled by sigmoid(shared_expert_gate)
Qwen3MoeForCausalLM   RMSNorm over each head of q and k (as dense Qwen3); norm_topk_prob
MixtralForCausalLM    softmax over the top-k logits (= renormalized top-k); num_local_experts
OlmoeForCausalLM      RMSNorm over the whole q and k projections (not per head), optional clip_qkv
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import get_tp_group
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.moe.moe_block import MoeSpec
from radixlm.model.models.llama import LlamaAttention, LlamaMLP, get_head_dim
from radixlm.model.models.moe import MoeForCausalLM
from radixlm.model.tp_shard import TensorSlice

_QK_NORM_RE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(q_norm|k_norm)\.weight$")


class Qwen2MoeForCausalLM(MoeForCausalLM):
    qkv_bias = True

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_experts,
            config.num_experts_per_tok,
            config.moe_intermediate_size,
            bool(config.norm_topk_prob),
        )

    def shared_expert(self, config: Any) -> nn.Module | None:
        size = getattr(config, "shared_expert_intermediate_size", 0)
        return LlamaMLP(config.hidden_size, size) if size else None


class Qwen3MoeForCausalLM(MoeForCausalLM):
    qk_norm = True

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_experts,
            config.num_experts_per_tok,
            config.moe_intermediate_size,
            bool(config.norm_topk_prob),
        )


class MixtralForCausalLM(MoeForCausalLM):
    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_local_experts, config.num_experts_per_tok, config.intermediate_size, True
        )


class ShardedRMSNorm(nn.Module):
    """RMSNorm over a projection's full width when a tensor-parallel rank holds part of it: the
    squares are summed over the ranks (a KV head held by several ranks counted once). With one
    rank it is HF's RMSNorm op for op."""

    def __init__(self, local: int, full: int, eps: float, replicas: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(local))
        self.full, self.eps, self.replicas = full, eps, replicas
        self.tp = get_tp_group()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, x32 = x.dtype, x.float()
        if self.tp.world_size == 1:
            var = x32.pow(2).mean(-1, keepdim=True)
        else:
            sq = x32.pow(2).sum(-1, keepdim=True).contiguous()
            self.tp.device_comm.all_reduce(sq)
            var = sq / (self.replicas * self.full)
        return self.weight * (x32 * torch.rsqrt(var + self.eps)).to(dtype)


class OlmoeAttention(LlamaAttention):
    def __init__(self, config: Any, layer_id: int, rotary_emb, qkv_bias: bool, qk_norm: bool):
        super().__init__(config, layer_id, rotary_emb, qkv_bias, qk_norm=False)
        head_dim, qkv = get_head_dim(config), self.qkv_proj
        total_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.q_norm = ShardedRMSNorm(
            self.q_size, config.num_attention_heads * head_dim, config.rms_norm_eps
        )
        self.k_norm = ShardedRMSNorm(
            self.kv_size, total_kv * head_dim, config.rms_norm_eps, qkv.kv_replicas
        )
        self.clip_qkv = getattr(config, "clip_qkv", None)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:  # after the norms, as HF does
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))

    def norm_slice(self, which: str) -> TensorSlice | None:
        """This rank's part of the q_norm / k_norm weight: the rows of its q / k heads."""
        qkv = self.qkv_proj
        if qkv.tp_size == 1:
            return None
        shard = 0 if which == "q_norm" else 1
        return TensorSlice.of(0, qkv.shard_start(shard), qkv.output_sizes[shard])


class OlmoeForCausalLM(MoeForCausalLM):
    attention_cls = OlmoeAttention

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_experts,
            config.num_experts_per_tok,
            config.intermediate_size,
            bool(config.norm_topk_prob),
        )

    def tp_slice(self, name: str) -> TensorSlice | None:
        m = _QK_NORM_RE.match(name)
        if m:
            return self.model.layers[int(m.group(1))].self_attn.norm_slice(m.group(2))
        return super().tp_slice(name)
