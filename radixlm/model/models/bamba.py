"""Bamba (HF BambaForCausalLM): a hybrid decoder whose layers are a Mamba-2 mixer
(model/layers/linear_attn/mamba2.py, as Granite-4.0-H's) or attention (Llama's, RoPE over the first
half of each head: BambaConfig fixes partial_rotary_factor 0.5), each followed by a SwiGLU MLP
(feed_forward); pre-norms input_layernorm and pre_ff_layernorm. The attention layers are
attn_layer_indices (layers_block_type in the config).

llama.cpp's converter writes Bamba as `granitehybrid` (RoPE on, no experts, no multipliers), which
radixlm reads as GraniteMoeHybridForCausalLM: the same computation (archs/mamba2_hybrid.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.mamba2 import Mamba2Dims, Mamba2Mixer
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import get_rope
from radixlm.model.models.hybrid import (
    HybridDecoderLayer,
    HybridForCausalLM,
    build_layers,
    hybrid_layer_types,
)
from radixlm.model.models.llama import LlamaAttention, LlamaMLP, get_head_dim

LAYER_TYPES = ("linear_attention", "full_attention")


class BambaDecoderLayer(HybridDecoderLayer):
    POST_NORM = "pre_ff_layernorm"

    def __init__(self, config: Any, layer_type: str, index: int, rotary):
        """index: the layer's number among the layers of its type (its KV or state layer)."""
        super().__init__()
        self.is_linear = layer_type == "linear_attention"
        if self.is_linear:
            self.mamba = Mamba2Mixer(Mamba2Dims.from_mamba_config(config, "Bamba"), index)
        else:
            self.self_attn = LlamaAttention(config, index, rotary, qkv_bias=False, qk_norm=False)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.feed_forward = LlamaMLP(
            config.hidden_size, config.intermediate_size, bias=bool(config.mlp_bias)
        )

    def state_layer(self) -> Mamba2Mixer | None:
        return self.mamba if self.is_linear else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        hidden, residual = self.mix(positions, hidden, fb, residual)
        return self.feed_forward(hidden), residual


class BambaModel(DecoderStack):
    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        if config.hidden_act != "silu":  # the MLP's and the mixer's conv activation
            raise ValueError(f"Bamba hidden_act {config.hidden_act!r}: radixlm runs silu")
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = rotary = get_rope(get_head_dim(config), config)
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: BambaDecoderLayer(config, t, n, rotary),
            self.pp.layers,
        )
        self.final_layernorm = self.on_last(
            lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        )

    def final_norm(self, hidden, residual):
        return self.final_layernorm(hidden, residual)[0]


class BambaForCausalLM(HybridForCausalLM):
    def build_hybrid_model(self, config: Any) -> nn.Module:
        return BambaModel(config)
