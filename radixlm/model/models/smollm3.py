"""SmolLM3: the Llama graph where some layers skip RoPE (NoPE).

config.no_rope_layers holds one flag per layer, 1 = rotate q/k, 0 = NoPE (transformers fills it
from no_rope_layer_interval: every 4th layer has no RoPE). Windows come as in Llama: HF's config
marks layers sliding only with use_sliding_window (get_sliding_window reads layer_types)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.models.llama import LlamaForCausalLM, LlamaModel


class NoRope(nn.Module):
    """A NoPE layer's stand-in for the shared RotaryEmbedding: q and k pass unrotated."""

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


def rope_layers(config: Any) -> list[bool]:
    """Per layer, whether it applies RoPE (HF: config.no_rope_layers[i] truthy)."""
    flags = getattr(config, "no_rope_layers", None)
    if flags is None:  # an old config: transformers' default from the interval
        n = getattr(config, "no_rope_layer_interval", 4)
        flags = [(i + 1) % n != 0 for i in range(config.num_hidden_layers)]
    return [bool(f) for f in flags]


class SmolLM3ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        model = LlamaModel(config)
        no_rope = NoRope()
        for i, use_rope in enumerate(rope_layers(config)):
            if not use_rope and i in model.pp.layers:
                model.layers[i].self_attn.rotary_emb = no_rope
        # The fused native op rotates every layer's q/k.
        model.use_fused_layers = False
        return model
