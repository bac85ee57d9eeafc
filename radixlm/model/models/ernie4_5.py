"""ERNIE 4.5 dense (Ernie4_5ForCausalLM): the Llama graph (use_bias: every projection's bias)
whose RoPE rotates interleaved pairs (2j, 2j + 1) of each head (GPT-J / GLM style) instead of
halves (j, j + D/2). Rows of q and k are reordered at load, within each head, from the pairs'
order to the halves' (both sides of q.k move alike, so attention is unchanged): the model then
runs the shared rotate-half RoPE, the one-op decoder included. llama.cpp's converter writes the
HF rows as they are (its ernie4_5 graph rotates pairs), so a GGUF loads the same way."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from radixlm.model.layers.rotary import interleaved_to_rotate_half
from radixlm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    get_head_dim,
)
from radixlm.model.models.seed_oss import check_silu


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        check_silu(config)
        bias = bool(getattr(config, "use_bias", False))

        def layer(i: int, rope) -> nn.Module:
            attn = LlamaAttention(config, i, rope, qkv_bias=bias, qk_norm=False, o_bias=bias)
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size, bias=bias)
            return LlamaDecoderLayer(config, i, rope, self_attn=attn, mlp=mlp)

        return LlamaModel(config, build_layer=layer)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(reordered_qk(weights, get_head_dim(self.config)))


def reordered_qk(weights: Iterable[tuple[str, Any]], head_dim: int) -> Iterator[tuple[str, Any]]:
    """The checkpoint's tensors with q / k rows (weights and biases) in rotate-half order."""
    for name, tensor in weights:
        if ".self_attn.q_proj." in name or ".self_attn.k_proj." in name:
            tensor = interleaved_to_rotate_half(tensor, head_dim)
        yield name, tensor
