"""Falcon-H1 (HF FalconH1ForCausalLM): every layer runs attention (GQA with RoPE) and a Mamba-2
mixer (model/layers/linear_attn/mamba2.py) in parallel on the same normed input and adds their
outputs; then a SwiGLU MLP. So each layer is both a KV layer and a state layer (layer i is KV layer
i and state layer i).

muP multipliers (config), each applied where HF applies it: embeddings times embedding_multiplier;
the mixer's input times ssm_in_multiplier and its in_proj output times the mup vector (per part: z,
x, B, C, dt from ssm_multipliers), its output times ssm_out_multiplier; the attention's input times
attention_in_multiplier, k times key_multiplier, its output times attention_out_multiplier; the
MLP's gate times mlp_multipliers[0] before the activation, its output times mlp_multipliers[1];
logits times lm_head_multiplier.

The mixer's gated norm is optional (mamba_rms_norm; without it y * silu(z)) and may norm before
the gate (mamba_norm_before_gate).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.linear_attn.mamba2 import GroupedGatedRMSNorm, Mamba2Dims, Mamba2Mixer
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.hybrid import HybridForCausalLM
from radixlm.model.models.llama import get_head_dim


def mup_vector(config: Any, d: Mamba2Dims) -> torch.Tensor:
    """HF's compute_mup_vector: one multiplier per in_proj output part (z, x, B, C, dt)."""
    gn = d.n_groups * d.state_size
    sizes = [d.intermediate, d.intermediate, gn, gn, d.num_heads]
    parts = [torch.full((n,), float(m)) for n, m in zip(sizes, config.ssm_multipliers)]
    return torch.cat(parts).to(torch.get_default_dtype())


class GateThenOut(nn.Module):
    """mamba_rms_norm off: y * silu(z), float32 (no weight)."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x.float() * F.silu(z.float())


class NormThenGate(GroupedGatedRMSNorm):
    """mamba_norm_before_gate: w * RMSNorm(y) per group, then times silu(z), float32."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x32 = x.float().reshape(n, -1, self.group_size)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.float() * x32.reshape(n, -1) * F.silu(z.float())


class FalconH1Mixer(Mamba2Mixer):
    def __init__(self, config: Any, state_layer_id: int):
        super().__init__(Mamba2Dims.from_mamba_config(config, "Falcon-H1"), state_layer_id)
        d = self.dims
        self.ssm_in_multiplier = float(config.ssm_in_multiplier)
        self.register_buffer("mup_vector", mup_vector(config, d), persistent=False)
        if not config.mamba_rms_norm:
            self.norm = GateThenOut()
        elif config.mamba_norm_before_gate:
            self.norm = NormThenGate(d.intermediate, d.intermediate // d.n_groups, d.eps)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.in_proj(hidden * self.ssm_in_multiplier) * self.mup_vector


class FalconH1Attention(nn.Module):
    def __init__(self, config: Any, kv_layer_id: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.head_dim = head_dim = get_head_dim(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        bias = bool(config.attention_bias)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, heads, kv_heads, bias=bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, bias=bias, what="num_attention_heads * head_dim"
        )
        self.key_multiplier = float(config.key_multiplier)
        self.rotary_emb = rotary_emb
        self.attn = RadixAttention(
            self.num_heads, head_dim, head_dim**-0.5, self.num_kv_heads, kv_layer_id
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch):
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k * self.key_multiplier)
        return self.o_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous(), fb))


class FalconH1MLP(nn.Module):
    """SwiGLU with muP multipliers: down(silu(gate * gm) * up) * dm."""

    def __init__(self, config: Any):
        super().__init__()
        bias, size = bool(config.mlp_bias), config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(
            size, config.hidden_size, bias=bias, what="intermediate_size"
        )
        self.gate_multiplier, self.down_multiplier = (float(m) for m in config.mlp_multipliers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate * self.gate_multiplier) * up) * self.down_multiplier


class FalconH1DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.mamba = FalconH1Mixer(config, layer_id)
        self.self_attn = FalconH1Attention(config, layer_id, rotary_emb)
        self.feed_forward = FalconH1MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attention_in_multiplier = float(config.attention_in_multiplier)
        self.attention_out_multiplier = float(config.attention_out_multiplier)
        self.ssm_out_multiplier = float(config.ssm_out_multiplier)

    def state_layer(self) -> Mamba2Mixer:
        return self.mamba

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        ssm = self.mamba(hidden, fb) * self.ssm_out_multiplier
        attn = self.self_attn(positions, hidden * self.attention_in_multiplier, fb)
        hidden = ssm + attn * self.attention_out_multiplier
        hidden, residual = self.pre_ff_layernorm(hidden, residual)
        return self.feed_forward(hidden), residual


class FalconH1Model(DecoderStack):
    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        self.embed_tokens = self.stage_embedding(config)
        self.embedding_multiplier = float(config.embedding_multiplier)
        self.rotary_emb = rotary = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: FalconH1DecoderLayer(config, i, rotary)
        )
        self.num_kv_layers = config.num_hidden_layers  # every layer attends
        self.final_layernorm = self.on_last(
            lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        )

    def embed(self, input_ids, input_embeds):
        if input_embeds is None:  # HF scales only the embeddings it looks up itself
            return self.embed_tokens(input_ids) * self.embedding_multiplier
        return input_embeds

    def final_norm(self, hidden, residual):
        return self.final_layernorm(hidden, residual)[0]


class FalconH1ForCausalLM(HybridForCausalLM):
    def build_hybrid_model(self, config: Any) -> nn.Module:
        return FalconH1Model(config)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) * float(self.config.lm_head_multiplier)
