"""GLM-4-0414 / GLM-Z1 (Glm4ForCausalLM; transformers' modeling_glm4 is the reference).

The Llama graph (pre-norm, the residual stream riding along) with:
- a norm after each branch too, before it joins the stream (Gemma 2's sandwich under other
  names): input_layernorm -> attention -> post_self_attn_layernorm, then post_attention_layernorm
  (the MLP's pre-norm) -> MLP -> post_mlp_layernorm;
- attention: q/k/v bias when attention_bias, never an o_proj bias; partial RoPE (the first
  partial_rotary_factor of each head, 0.5) over interleaved pairs, which load_weights turns into
  the rotate_half order RotaryEmbedding applies (rotary.interleaved_to_rotate_half);
- the MLP's gate and up stored as one mlp.gate_up_proj ([gate; up] rows), cut at load into the
  fused layer's shards (quantized GGUF rows too).

M-RoPE sections in the config are refused here (a text-only GLM-4 has no images to place); GLM-4V's
decoder (glm4v.py: Glm4vTextForCausalLM) is this one with them, and q/k/v always biased.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.linear import split_rows
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope, interleaved_to_rotate_half
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, get_head_dim


class Glm4DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding, qkv_bias: bool):
        super().__init__()
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.self_attn = LlamaAttention(
            config,
            layer_id,
            rotary_emb,
            qkv_bias=qkv_bias,
            qk_norm=False,
            o_bias=False,
        )
        self.mlp = LlamaMLP(hidden, config.intermediate_size)
        self.input_layernorm = RMSNorm(hidden, eps=eps)
        self.post_self_attn_layernorm = RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps=eps)
        self.post_mlp_layernorm = RMSNorm(hidden, eps=eps)

    def forward(self, positions, hidden, forward_batch, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_self_attn_layernorm(self.self_attn(positions, hidden, forward_batch))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.post_mlp_layernorm(self.mlp(hidden)), residual


class Glm4Model(DecoderStack):
    def __init__(self, config: Any, qkv_bias: bool):
        super().__init__()
        self.init_stack(config, fused=False)  # the one-op native decoder has no post-norms
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = rope = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: Glm4DecoderLayer(config, i, rope, qkv_bias)
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))


class Glm4ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":  # the MLP is SiluAndMul
            raise ValueError(f"{type(self).__name__}: hidden_act {act!r} is not supported (silu)")
        self.check_rope(config)
        return Glm4Model(config, self.qkv_bias(config))

    def check_rope(self, config: Any) -> None:
        """A text-only GLM-4 has no images to place: M-RoPE sections are refused (GLM-4V's
        decoder, glm4v.py, takes them)."""
        params = getattr(config, "rope_parameters", None) or {}
        if params.get("mrope_section"):  # GLM-4V's text model: M-RoPE positions
            raise ValueError(
                "Glm4ForCausalLM: rope_parameters.mrope_section is not supported (GLM-4V's M-RoPE"
                " is Glm4vForConditionalGeneration's)"
            )

    def qkv_bias(self, config: Any) -> bool:
        return bool(getattr(config, "attention_bias", False))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._hf_layout(weights))

    def _hf_layout(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        head_dim = get_head_dim(self.config)
        rotary_dim = self.model.rotary_emb.rotary_dim
        for name, tensor in weights:
            if name.endswith(".mlp.gate_up_proj.weight"):
                inter = self.config.intermediate_size
                if tensor.shape[0] != 2 * inter:
                    raise ValueError(f"{name}: expected {2 * inter} rows, got {tensor.shape[0]}")
                base = name.removesuffix("gate_up_proj.weight")
                gate, up = split_rows(tensor, [inter, inter])
                yield base + "gate_proj.weight", gate
                yield base + "up_proj.weight", up
            elif ".self_attn.q_proj." in name or ".self_attn.k_proj." in name:
                yield name, interleaved_to_rotate_half(tensor, head_dim, rotary_dim)
            else:
                yield name, tensor
