"""Qwen3.5 (HF Qwen3_5ForCausalLM, and the text model of Qwen3_5ForConditionalGeneration): a
hybrid decoder. Its config's layer_types mark each layer linear_attention (Gated DeltaNet:
model/layers/linear_attn/gated_delta_net.py, a recurrent state per request) or full_attention
(gated attention: q_proj yields each head's query and an output gate; q/k RMSNorm; RoPE on the
first partial_rotary_factor of each head). Norms multiply by 1 + w (OffsetRMSNorm).

Only the full-attention layers keep KV: they are numbered among themselves for the KV pool
(`num_kv_layers`), the state layers among themselves for the state pool (`state_specs`).
Qwen3.5's text positions are M-RoPE's with the three sections equal: plain RoPE over the rotary
dims. Under images (qwen3_5_vl.py: MROPE) the decoder turns by interleaved M-RoPE.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.fused_qwen3_5_layers import (
    build_fused_qwen3_5_layers,
)
from radixlm.model.layers.linear_attn.gated_delta_net import GatedDeltaNet
from radixlm.model.layers.norm import OffsetRMSNorm
from radixlm.model.layers.parallel_linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.layers.rotary import MRotaryEmbedding, RotaryEmbedding, rope_parameters
from radixlm.model.models.hybrid import (
    HybridDecoderLayer,
    HybridForCausalLM,
    build_layers,
    hybrid_layer_types,
)
from radixlm.model.models.llama import LlamaMLP

LAYER_TYPES = ("linear_attention", "full_attention")


def text_rope(head_dim: int, config: Any, mrope: bool = False) -> RotaryEmbedding:
    """RoPE over the first partial_rotary_factor of each head (M-RoPE with equal positions is
    plain RoPE for text). mrope: M-RoPE (images), interleaved whatever the config says, as
    transformers' Qwen3_5TextRotaryEmbedding always recomposes (its default sections too)."""
    params = rope_parameters(config)
    if mrope:
        params.setdefault("mrope_section", [11, 11, 10])
        params["mrope_interleaved"] = True
        return MRotaryEmbedding(head_dim, config.max_position_embeddings, params)
    params.pop("mrope_section", None)
    params.pop("mrope_interleaved", None)
    return RotaryEmbedding(head_dim, config.max_position_embeddings, params)


class Qwen3_5Attention(nn.Module):
    def __init__(self, config: Any, kv_layer_id: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q, kv
        bias = bool(getattr(config, "attention_bias", False))
        # q_proj: per head, its query then its gate (HF's layout), then k and v
        self.qkv_proj = MergedColumnParallelLinear(config.hidden_size, [2 * q, kv, kv], bias=bias)
        self.o_proj = RowParallelLinear(q, config.hidden_size, bias=bias, what="attention heads")
        self.q_norm = OffsetRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, kv_layer_id
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch):
        n = hidden.shape[0]
        qg, k, v = self.qkv_proj(hidden).split([2 * self.q_size, self.kv_size, self.kv_size], -1)
        q, gate = qg.reshape(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        # per head: rows of head_dim (2-D, so the fused kernel takes them)
        q = self.q_norm(q.reshape(-1, self.head_dim)).reshape(n, self.q_size)
        k = self.k_norm(k.reshape(-1, self.head_dim)).reshape(n, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v.contiguous(), fb) * torch.sigmoid(gate.reshape(n, self.q_size))
        return self.o_proj(out)


class Qwen3_5DecoderLayer(HybridDecoderLayer):
    def __init__(
        self,
        config: Any,
        layer_type: str,
        index: int,
        rotary_emb: RotaryEmbedding,
        mlp: nn.Module,
    ):
        """index: the layer's number among the layers of its type (its KV or state layer)."""
        super().__init__()
        self.is_linear = layer_type == "linear_attention"
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, index)
        else:
            self.self_attn = Qwen3_5Attention(config, index, rotary_emb)
        self.mlp = mlp
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def state_layer(self) -> GatedDeltaNet | None:
        return self.linear_attn if self.is_linear else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        hidden, residual = self.mix(positions, hidden, fb, residual)
        return self.mlp(hidden), residual


class Qwen3_5Model(DecoderStack):
    def __init__(
        self, config: Any, build_mlp: Callable[[Any, int], nn.Module], mrope: bool = False
    ):
        """build_mlp(config, layer index): each layer's MLP (dense, or a mixture of experts);
        mrope: positions by M-RoPE (the decoder of a model with images)."""
        super().__init__()
        # All layers in one native op where it applies (layers/fused_qwen3_5_layers.py).
        self.init_stack(config)
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = rotary = text_rope(config.head_dim, config, mrope)
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: Qwen3_5DecoderLayer(config, t, n, rotary, build_mlp(config, i)),
            self.pp.layers,
        )
        self.norm = self.on_last(lambda: OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def build_fused(self):
        return build_fused_qwen3_5_layers(self, LlamaMLP)


class Qwen3_5ForCausalLM(HybridForCausalLM):
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", 0),
        ("qkv_proj", "k_proj", 1),
        ("qkv_proj", "v_proj", 2),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
        ("in_proj_qkvz", "in_proj_qkv", 0),
        ("in_proj_qkvz", "in_proj_z", 1),
        ("in_proj_ba", "in_proj_b", 0),
        ("in_proj_ba", "in_proj_a", 1),
    ]
    # Checkpoint parts this text model does not run: the multi-token-prediction head, the vision
    # tower of a Qwen3_5ForConditionalGeneration checkpoint.
    SKIPPED_PREFIXES = ("mtp.", "model.visual.", "visual.")
    MROPE = False  # the decoder of Qwen3_5ForConditionalGeneration turns by M-RoPE (qwen3_5_vl.py)

    def __init__(self, config: Any):
        super().__init__(config.get_text_config())

    def build_hybrid_model(self, config: Any) -> nn.Module:
        return Qwen3_5Model(config, self.build_mlp, self.MROPE)

    def build_mlp(self, config: Any, layer_id: int) -> nn.Module:
        return LlamaMLP(config.hidden_size, config.intermediate_size)

    # The projections whose outputs set the state's decay and write strength (through exp and
    # sigmoid): tiny (two rows per value head), run in float so that no activation rounding
    # reaches an exponent (a GGUF's quantized ones are dequantized at load).
    FLOAT_WEIGHTS = (".in_proj_b.weight", ".in_proj_a.weight", ".in_proj_ba.weight")

    def load_weights(self, weights) -> None:
        super().load_weights(
            (
                n,
                t.dequantize()
                if isinstance(t, QuantizedTensor) and n.endswith(self.FLOAT_WEIGHTS)
                else t,
            )
            for n, t in weights
        )

    def takes_quantized(self, name: str) -> bool:
        return not name.endswith(self.FLOAT_WEIGHTS) and super().takes_quantized(name)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        if name.startswith("model.language_model."):  # a ConditionalGeneration checkpoint
            name = "model." + name.removeprefix("model.language_model.")
        return super()._map_name(name)
