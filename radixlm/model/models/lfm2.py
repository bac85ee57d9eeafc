"""LFM2 (HF Lfm2ForCausalLM): a hybrid decoder whose layer_types mark each layer conv (a gated short
convolution: model/layers/linear_attn/short_conv.py, a conv window per request) or full_attention
(GQA with RMSNorm over each head of q and k, then RoPE); every layer then has a SwiGLU MLP
(feed_forward: w1 gate, w3 up, w2 down). Pre-norms operator_norm and ffn_norm; the final norm is
HF's `embedding_norm` (applied after the last layer, whatever its name says).

Older configs give full_attn_idxs instead of layer_types (the config class turns them into
layer_types). The MLP's width is HF's: with block_auto_adjust_ff_dim, int(2 * intermediate / 3),
times block_ffn_dim_multiplier and rounded up to block_multiple_of when a multiplier is set.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.linear_attn.short_conv import ShortConv
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    QKVParallelLinear,
    RowParallelLinear,
)
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.hybrid import (
    HybridDecoderLayer,
    HybridForCausalLM,
    build_layers,
    hybrid_layer_types,
)
from radixlm.model.models.llama import LlamaMLP, get_head_dim

LAYER_TYPES = ("conv", "full_attention")


def lfm2_ff_dim(config: Any) -> int:
    """Lfm2MLP's width from the config (HF's arithmetic, as is)."""
    size = config.intermediate_size
    if getattr(config, "block_auto_adjust_ff_dim", False):
        size = int(2 * size / 3)
        multiplier = getattr(config, "block_ffn_dim_multiplier", None)
        if multiplier is not None:
            size = int(multiplier * size)
            step = config.block_multiple_of
            size = step * ((size + step - 1) // step)
    return size


class Lfm2Attention(nn.Module):
    def __init__(self, config: Any, kv_layer_id: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.head_dim = head_dim = get_head_dim(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, heads, kv_heads)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.out_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, what="num_attention_heads * head_dim"
        )
        self.q_layernorm = RMSNorm(head_dim, eps=config.norm_eps)
        self.k_layernorm = RMSNorm(head_dim, eps=config.norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = RadixAttention(
            self.num_heads, head_dim, head_dim**-0.5, self.num_kv_heads, kv_layer_id
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch):
        n = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_layernorm(q.reshape(n, self.num_heads, self.head_dim)).reshape(n, self.q_size)
        k = self.k_layernorm(k.reshape(n, self.num_kv_heads, self.head_dim))
        q, k = self.rotary_emb(positions, q, k.reshape(n, self.kv_size))
        return self.out_proj(self.attn(q, k, v.contiguous(), fb))


class Lfm2DecoderLayer(HybridDecoderLayer):
    INPUT_NORM = "operator_norm"
    POST_NORM = "ffn_norm"
    FFN = "feed_forward"  # the feed-forward's name (LFM2-MoE's layers hold it as `mlp`)

    def __init__(
        self,
        config: Any,
        layer_type: str,
        index: int,
        rotary_emb: RotaryEmbedding,
        ffn: nn.Module | None = None,
    ):
        """index: the layer's number among the layers of its type (its KV or state layer); ffn:
        the feed-forward (default LFM2's SwiGLU MLP)."""
        super().__init__()
        self.is_linear = layer_type == "conv"
        if self.is_linear:
            self.conv = ShortConv(
                config.hidden_size, config.conv_L_cache, bool(config.conv_bias), index
            )
        else:
            self.self_attn = Lfm2Attention(config, index, rotary_emb)
        setattr(self, self.FFN, ffn or LlamaMLP(config.hidden_size, lfm2_ff_dim(config)))
        self.operator_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.ffn_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)

    def state_layer(self) -> ShortConv | None:
        return self.conv if self.is_linear else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        hidden, residual = self.mix(positions, hidden, fb, residual)
        return getattr(self, self.FFN)(hidden), residual


class Lfm2Model(DecoderStack):
    def __init__(self, config: Any, layer_cls: type[Lfm2DecoderLayer] = Lfm2DecoderLayer, ffn=None):
        """ffn(layer id) -> the layer's feed-forward, or None for LFM2's MLP."""
        super().__init__()
        self.init_stack(config, fused=False)
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = rotary = get_rope(get_head_dim(config), config)
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: layer_cls(config, t, n, rotary, ffn(i) if ffn else None),
            self.pp.layers,
        )
        self.embedding_norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.norm_eps))

    def final_norm(self, hidden, residual):
        return self.embedding_norm(hidden, residual)[0]


class Lfm2ForCausalLM(HybridForCausalLM):
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", 0),
        ("qkv_proj", "k_proj", 1),
        ("qkv_proj", "v_proj", 2),
        ("gate_up_proj", "w1", 0),
        ("gate_up_proj", "w3", 1),
    ]

    def build_hybrid_model(self, config: Any) -> nn.Module:
        return Lfm2Model(config)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        if name.endswith(".feed_forward.w2.weight"):  # the MLP's down projection
            name = name.replace(".feed_forward.w2.", ".feed_forward.down_proj.")
        return super()._map_name(name)
