"""Gemma 2: the Llama attention and MLP with Gemma's knobs, in a sandwich-norm decoder layer.

What differs from Llama: embeddings scaled by sqrt(hidden) (in the model dtype, as HF), Gemma's
RMSNorm (x * (1 + w) in float32: OffsetRMSNorm), a norm before and after both attention and MLP,
a GELU-tanh gated MLP,
query_pre_attn_scalar ** -0.5 as the attention scale, attention and final logit soft-capping,
and sliding-window (local) layers alternating with global ones (config.layer_types). Gemma 3
(gemma3.py) turns two more knobs: q/k norms and a RoPE per layer type. The layers run as one native
op where their projections are quantized (layers/fused_layers.py, with its sandwich norms).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.activation import GeluAndMul
from radixlm.model.layers.fused_layers import build_fused_layers
from radixlm.model.layers.norm import OffsetRMSNorm
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, get_head_dim

# HF hidden_activation -> F.gelu's approximate
_GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


def gemma_act(config: Any) -> GeluAndMul:
    act = (
        getattr(config, "hidden_activation", None)
        or getattr(config, "hidden_act", None)
        or "gelu_pytorch_tanh"
    )
    if act not in _GELU:
        raise ValueError(
            f"unsupported Gemma hidden_activation {act!r}; supported: {', '.join(_GELU)}"
        )
    return GeluAndMul(_GELU[act])


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding, qk_norm: bool):
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = LlamaAttention(
            config,
            layer_id,
            rotary_emb,
            qkv_bias=bool(getattr(config, "attention_bias", False)),
            qk_norm=qk_norm,
            scaling=config.query_pre_attn_scalar**-0.5,
            logit_cap=getattr(config, "attn_logit_softcapping", None) or 0.0,
            norm_cls=OffsetRMSNorm,
        )
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, act_fn=gemma_act(config))
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, eps=eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(config.hidden_size, eps=eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(config.hidden_size, eps=eps)

    def forward(self, positions, hidden, forward_batch, residual):
        # The residual stream rides along as in Llama; the post norms apply to the branch outputs
        # before they join it (HF: residual + post_norm(branch)).
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, forward_batch))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma2Model(DecoderStack):
    def __init__(self, config: Any, rotary_embs: list[RotaryEmbedding], qk_norm: bool = False):
        """rotary_embs: each layer's RoPE (shared objects: one cos/sin cache per kind)."""
        super().__init__()
        self.init_stack(config)
        self.embed_tokens = self.stage_embedding(config)
        # HF multiplies by sqrt(hidden) cast to the weights' dtype (Gemma2TextScaledWordEmbedding).
        self.register_buffer(
            "normalizer",
            torch.tensor(math.sqrt(config.hidden_size), dtype=torch.float32),
            persistent=False,
        )
        self.layers = self.stage_layers(
            config.num_hidden_layers,
            lambda i: Gemma2DecoderLayer(config, i, rotary_embs[i], qk_norm),
        )
        self.norm = self.on_last(lambda: OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def build_fused(self):
        """All layers in one native op where it applies (model/layers/fused_layers.py)."""
        forwards = (Gemma2DecoderLayer.forward, LlamaAttention.forward, LlamaMLP.forward)
        return build_fused_layers(self, forwards, sandwich=True)

    def embed(self, input_ids, input_embeds):
        if input_embeds is not None:  # scaled where they were looked up (HF likewise)
            return input_embeds
        hidden = self.embed_tokens(input_ids)
        return hidden * self.normalizer.to(hidden.dtype)


class Gemma2ForCausalLM(LlamaForCausalLM):
    qk_norm = False

    def build_model(self, config: Any) -> nn.Module:
        return Gemma2Model(config, self.rotary_embs(config), qk_norm=self.qk_norm)

    def rotary_embs(self, config: Any) -> list[RotaryEmbedding]:
        """Each layer's RoPE: Gemma 2 has one for all."""
        return [get_rope(get_head_dim(config), config)] * config.num_hidden_layers

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden_states)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:  # HF: cap * tanh(logits / cap), on the lm_head's output
            logits = torch.tanh(logits / cap) * cap
        return logits
