"""Granite-4.0-H (HF GraniteMoeHybridForCausalLM): a hybrid decoder whose layer_types mark each
layer's mixer a Mamba-2 (linear_attention: model/layers/linear_attn/mamba2.py, a recurrent state per
request) or attention (full_attention: GQA, RoPE only when position_embedding_type is "rope"; the
released H models use none); every layer then has a MoE (softmax over the top-k router logits)
plus an ungated shared expert, or the shared expert alone when num_local_experts is 0.

muP-style multipliers (config): embeddings times embedding_multiplier; the attention scale is
attention_multiplier (not head_dim ** -0.5); each sublayer's output times residual_multiplier
before its residual add; logits divided by logits_scaling.

Checkpoint names: the experts stacked as block_sparse_moe.input_linear ([E, 2I, H], gate rows
first) / output_linear, the router block_sparse_moe.router.layer (transformers 5.x's in-memory
experts.gate_up_proj / down_proj and router.weight too); the shared expert's input_linear is
[gate; up], split at load into LlamaMLP's gate_up_proj shards.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.linear_attn.mamba2 import Mamba2Dims, Mamba2Mixer
from radixlm.model.layers.moe.expert_dispatch import expert_dispatch, forward_idle
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    QKVParallelLinear,
    RowParallelLinear,
)
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.hybrid import (
    HybridDecoderLayer,
    HybridForCausalLM,
    build_layers,
    hybrid_layer_types,
)
from radixlm.model.models.llama import LlamaMLP, get_head_dim
from radixlm.model.models.moe import MoeForCausalLM

LAYER_TYPES = ("linear_attention", "full_attention")

# Checkpoint name -> the name MoeForCausalLM's expert loading reads (`mlp` is the SparseMoeBlock).
GRANITE_MOE_NAMES = (
    (".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
    (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
    (".block_sparse_moe.router.layer.weight", ".mlp.gate.weight"),
    (".block_sparse_moe.router.weight", ".mlp.gate.weight"),
    (".block_sparse_moe.experts.", ".mlp.experts."),
)
_SHARED_INPUT = re.compile(r"\.shared_mlp\.input_linear\.weight$")


class GraniteHybridAttention(nn.Module):
    def __init__(self, config: Any, kv_layer_id: int, rotary_emb: RotaryEmbedding | None):
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
        self.rotary_emb = rotary_emb
        scale = float(config.attention_multiplier)  # muP: replaces head_dim ** -0.5
        self.attn = RadixAttention(self.num_heads, head_dim, scale, self.num_kv_heads, kv_layer_id)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch):
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous(), fb))


class GraniteHybridDecoderLayer(HybridDecoderLayer):
    def __init__(self, config: Any, layer_type: str, index: int, rotary, dispatch, layer_id: int):
        """index: the layer's number among the layers of its type (its KV or state layer)."""
        super().__init__()
        self.is_linear = layer_type == "linear_attention"
        if self.is_linear:
            self.mamba = Mamba2Mixer(Mamba2Dims.from_mamba_config(config, "Granite-4.0-H"), index)
        else:
            self.self_attn = GraniteHybridAttention(config, index, rotary)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = None
        if config.num_local_experts:
            spec = MoeSpec(
                config.num_local_experts, config.num_experts_per_tok, config.intermediate_size, True
            )
            self.mlp = SparseMoeBlock(config.hidden_size, spec, layer_id, dispatch=dispatch)
        self.shared_mlp = LlamaMLP(config.hidden_size, config.shared_intermediate_size)
        self.residual_multiplier = float(config.residual_multiplier)

    def state_layer(self) -> Mamba2Mixer | None:
        return self.mamba if self.is_linear else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        # The residual stream rides along: the fused add + norm adds the scaled sublayer output.
        hidden, residual = self.mix(positions, hidden, fb, residual, self.residual_multiplier)
        out = self.shared_mlp(hidden)
        if self.mlp is not None:
            out = self.mlp(hidden) + out
        return out * self.residual_multiplier, residual


class GraniteHybridModel(DecoderStack):
    def __init__(self, config: Any, dispatch):
        super().__init__()
        self.init_stack(config, fused=False)
        self.dispatch = dispatch
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        self.embed_tokens = self.stage_embedding(config)
        self.embedding_multiplier = float(config.embedding_multiplier)
        use_rope = getattr(config, "position_embedding_type", None) == "rope"
        self.rotary_emb = get_rope(get_head_dim(config), config) if use_rope else None
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: GraniteHybridDecoderLayer(config, t, n, self.rotary_emb, dispatch, i),
            self.pp.layers,
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def embed(self, input_ids, input_embeds):
        return super().embed(input_ids, input_embeds) * self.embedding_multiplier

    def forward_idle(self) -> None:
        forward_idle(self.dispatch, [layer.mlp for layer in self.layers], self.stream_dtype())


class GraniteMoeHybridForCausalLM(HybridForCausalLM, MoeForCausalLM):
    """MoeForCausalLM's expert loading over the hybrid decoder."""

    def build_hybrid_model(self, config: Any) -> nn.Module:
        self.expert_dispatch = expert_dispatch()
        return GraniteHybridModel(config, self.expert_dispatch)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) / float(self.config.logits_scaling)

    def load_weights(self, weights) -> None:
        super().load_weights(pair for n, t in weights for pair in self._split_shared(n, t))

    def _split_shared(self, name: str, tensor) -> list[tuple[str, Any]]:
        """The shared expert's fused [gate; up] rows -> gate_proj and up_proj (whole rows: exact
        for quantized rows too)."""
        if not _SHARED_INPUT.search(name):
            return [(name, tensor)]
        base = name.removesuffix("input_linear.weight")
        half = self.config.shared_intermediate_size
        rows = tensor.data.shape[0] if isinstance(tensor, QuantizedTensor) else tensor.shape[0]
        if rows != 2 * half:
            raise ValueError(f"{name}: expected {2 * half} rows, got {rows}")
        return [
            (base + "gate_proj.weight", _rows(tensor, slice(0, half))),
            (base + "up_proj.weight", _rows(tensor, slice(half, 2 * half))),
        ]

    def _normalized(self, name: str) -> str:
        for old, new in GRANITE_MOE_NAMES:
            if old in name:
                return name.replace(old, new)
        return name.replace(".shared_mlp.output_linear.", ".shared_mlp.down_proj.")


def _rows(w, rows: slice):
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(w.data[rows].contiguous(), w.fmt, w.cols)
    return w[rows].contiguous()
