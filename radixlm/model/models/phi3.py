"""Phi-3 / Phi-3.5 / Phi-4-mini (transformers' Phi3ForCausalLM): the Llama graph.

Differences from Llama, all outside the graph:
- checkpoints store q/k/v as one `self_attn.qkv_proj` and gate/up as one `mlp.gate_up_proj`
  (rows q | k | v and gate | up, our fused layers' order); `load_weights` cuts them into the
  shards Llama's loader fills, so shapes are checked per shard and quantized GGUF blocks stay so;
- longrope rope scaling (the 128k variants) and partial_rotary_factor (Phi-4-mini):
layers/rotary.py.
  Each request uses the short factors while it fits original_max_position_embeddings and the long
  ones past it, as transformers' forward does; a request that crosses that length while decoding
  keeps the keys it cached with the short factors, where transformers' generate would recompute
  the whole sequence once (LongRopeRotaryEmbedding);
- `sliding_window` (Phi-3-mini-4k: 2047) applies to every layer, as for Mistral
  (llama.get_sliding_window); one at least the context length changes nothing (128k, 3.5).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from radixlm.model.layers.linear import split_rows
from radixlm.model.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    # fused HF module -> the shard names Llama's stacked_params_mapping packs back into it
    fused_params = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }

    def __init__(self, config: Any):
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":  # the MLP is SiluAndMul
            raise NotImplementedError(f"Phi3ForCausalLM: hidden_act {act!r} (only 'silu')")
        super().__init__(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._split_fused(weights))

    def _split_fused(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for name, tensor in weights:
            *prefix, module, kind = name.split(".")
            shards = self.fused_params.get(module)
            if shards is None:
                yield name, tensor
                continue
            sizes = self.get_submodule(".".join(prefix + [module])).output_sizes
            if tensor.shape[0] != sum(sizes):
                raise ValueError(
                    f"{name}: expected {sum(sizes)} rows ({sizes}), got {tensor.shape[0]}"
                )
            for shard, part in zip(shards, split_rows(tensor, sizes)):
                yield ".".join(prefix + [shard, kind]), part
