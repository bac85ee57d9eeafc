"""Granite 3.x / 4.0 dense (GraniteForCausalLM) and Granite 3.x MoE (GraniteMoeForCausalLM): the
Llama graph with Granite's muP multipliers (the same as Granite-4.0-H's, models/granite_hybrid.py):
the embeddings times embedding_multiplier, attention_multiplier as the attention scale (not
head_dim ** -0.5), each branch's output times residual_multiplier before it joins the stream, and
the logits divided by logits_scaling.

GraniteMoe puts a MoE in every layer's MLP place: softmax over the top-k router logits (= the full
softmax renormalized over the top k: MoeSpec renormalize), its experts stacked as
block_sparse_moe.input_linear ([E, 2I, H], gate rows first) / output_linear and its router as
block_sparse_moe.router.layer (transformers 5.x's in-memory experts.gate_up_proj / down_proj and
router.weight too), renamed at load to MoeForCausalLM's names.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.moe.expert_dispatch import expert_dispatch, forward_idle
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.granite_hybrid import GRANITE_MOE_NAMES
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, get_head_dim
from radixlm.model.models.moe import MoeDecoderLayer, MoeForCausalLM


class GraniteDecoderLayer(MoeDecoderLayer):
    """Llama's pre-norm layer over any attention and MLP, each branch's output scaled by
    residual_multiplier before the fused add + norm adds it to the stream."""

    def __init__(self, config: Any, attn: nn.Module, mlp: nn.Module):
        super().__init__(config, attn, mlp)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, positions, hidden, forward_batch, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, forward_batch) * self.residual_multiplier
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden) * self.residual_multiplier, residual


def granite_attention(config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> LlamaAttention:
    bias = bool(getattr(config, "attention_bias", False))
    return LlamaAttention(
        config, layer_id, rotary_emb, qkv_bias=bias, qk_norm=False,
        scaling=float(config.attention_multiplier),
    )  # fmt: skip


class GraniteModel(DecoderStack):
    """The Llama stack with the embeddings scaled; build_layer(config, layer id, rope) makes each
    layer (dense or MoE); dispatch: the experts' (None for a dense model)."""

    def __init__(self, config: Any, build_layer, dispatch=None):
        super().__init__()
        # the one-op native decoder has no multipliers
        self.init_stack(config, fused=False)
        self.dispatch = dispatch
        self.embed_tokens = self.stage_embedding(config)
        self.embedding_multiplier = float(config.embedding_multiplier)
        self.rotary_emb = rope = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: build_layer(config, i, rope)
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def embed(self, input_ids, input_embeds):
        if input_embeds is not None:  # HF scales inputs_embeds too
            return input_embeds * self.embedding_multiplier
        return self.embed_tokens(input_ids) * self.embedding_multiplier

    def forward_idle(self) -> None:
        forward_idle(self.dispatch, [layer.mlp for layer in self.layers], self.stream_dtype())


def _check_act(config: Any) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":  # the MLP and the experts are SiluAndMul
        raise ValueError(f"{config.architectures[0]}: hidden_act {act!r} is not supported (silu)")


class GraniteForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        _check_act(config)
        return GraniteModel(config, self.build_layer)

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        mlp = LlamaMLP(
            config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False))
        )
        return GraniteDecoderLayer(config, granite_attention(config, layer_id, rotary_emb), mlp)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) / float(self.config.logits_scaling)


class GraniteMoeForCausalLM(MoeForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        _check_act(config)
        if not getattr(config, "num_local_experts", 0):
            raise ValueError("GraniteMoeForCausalLM: num_local_experts must be at least 1")
        self.expert_dispatch = expert_dispatch()
        return GraniteModel(config, self.build_layer, self.expert_dispatch)

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_local_experts, config.num_experts_per_tok, config.intermediate_size, True
        )

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        moe = SparseMoeBlock(
            config.hidden_size, self.moe_spec(config), layer_id, dispatch=self.expert_dispatch
        )
        return GraniteDecoderLayer(config, granite_attention(config, layer_id, rotary_emb), moe)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) / float(self.config.logits_scaling)

    def _normalized(self, name: str) -> str:
        for old, new in GRANITE_MOE_NAMES:
            if old in name:
                return name.replace(old, new)
        return super()._normalized(name)
