"""What the hybrid families share (qwen3_5.py, nemotron_h.py, lfm2.py, bamba.py, ...): layers
numbered among their own type (an attention layer's number is its KV-pool layer, a state layer's its
state-pool layer), the checks of layer_types, the layers' norm / mixer / norm half
(HybridDecoderLayer), and the model-level answers the runner asks a hybrid for
(`num_kv_layers`, `state_specs`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.models.llama import LlamaForCausalLM
from radixlm.model.pp_stage import PPMissingLayer
from radixlm.model.traits import ModelTraits

FULL_ATTENTION = "full_attention"


def hybrid_layer_types(config: Any, known: tuple[str, ...]) -> list[str]:
    """config.layer_types, checked: a layer of a type radixlm does not run is a ValueError that
    names it (never a model that silently skips it)."""
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != config.num_hidden_layers:
        raise ValueError(
            f"layer_types has {len(types)} entries for num_hidden_layers {config.num_hidden_layers}"
        )
    for i, t in enumerate(types):
        if t not in known:
            raise ValueError(
                f"layer_types[{i}] = {t!r}: this architecture runs {', '.join(known)} layers"
            )
    return types


def build_layers(
    types: list[str], build: Callable[[int, str, int], nn.Module], stage: range | None = None
) -> tuple[nn.ModuleList, int]:
    """build(layer id, its type, its number among its type) for each layer of `stage` (None: all;
    the others PPMissingLayer, numbered all the same) -> (the layers, how many are full
    attention: the KV pool's layers, over every stage)."""
    counts: dict[str, int] = {}
    layers: list[nn.Module] = []
    for i, t in enumerate(types):
        held = stage is None or i in stage
        layers.append(build(i, t, counts.get(t, 0)) if held else PPMissingLayer())
        counts[t] = counts.get(t, 0) + 1
    return nn.ModuleList(layers), counts.get(FULL_ATTENTION, 0)


class HybridDecoderLayer(nn.Module):
    """A hybrid decoder layer: a recurrent token mixer (`state_layer()`, taking (hidden, fb)) or
    attention (`self_attn`, taking (positions, hidden, fb)), between a pre-norm and a post-norm
    whose checkpoint names the family sets (INPUT_NORM, POST_NORM). `mix` runs that half; the
    family's forward adds its MLP."""

    INPUT_NORM = "input_layernorm"
    POST_NORM = "post_attention_layernorm"

    def state_layer(self) -> nn.Module | None:
        raise NotImplementedError

    def mix(self, positions, hidden, fb, residual, scale: float | None = None):
        """(add +) pre-norm, the mixer, then the fused add + post-norm -> (the MLP's input, the
        residual); `scale` multiplies the mixer's output first (Granite's residual_multiplier)."""
        input_norm, post_norm = getattr(self, self.INPUT_NORM), getattr(self, self.POST_NORM)
        if residual is None:
            residual, hidden = hidden, input_norm(hidden)
        else:
            hidden, residual = input_norm(hidden, residual)
        mixer = self.state_layer()
        hidden = mixer(hidden, fb) if mixer is not None else self.self_attn(positions, hidden, fb)
        return post_norm(hidden if scale is None else hidden * scale, residual)


class HybridForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM's loading over a hybrid decoder. A family builds its decoder
    (build_hybrid_model: `layers`, `num_kv_layers`) whose layers say `state_layer()`: their
    recurrent layer (with `state_specs`), or None."""

    # Checkpoint parts the model does not run (multi-token-prediction heads, vision towers).
    SKIPPED_PREFIXES: tuple[str, ...] = ()

    def build_model(self, config: Any) -> nn.Module:
        return self.build_hybrid_model(config)

    def build_hybrid_model(self, config: Any) -> nn.Module:
        raise NotImplementedError

    def traits(self) -> ModelTraits:
        return dataclasses.replace(
            super().traits(), num_kv_layers=self.num_kv_layers, is_hybrid=True
        )

    @property
    def num_kv_layers(self) -> int:
        return self.model.num_kv_layers

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[list[StateSpec]]:
        """Per state layer, in order, the tensors of its per-request state; a pipeline stage's
        pool holds its own layers' only (the others' lists empty: no tensors, the same ids)."""
        by_id = {}
        for layer in self.model.layers:
            state = None if isinstance(layer, PPMissingLayer) else layer.state_layer()
            if state is not None:
                by_id[state.state_layer_id] = state.state_specs(conv_dtype, ssm_dtype)
        return [by_id.get(i, []) for i in range(max(by_id, default=-1) + 1)]

    def load_weights(self, weights) -> None:
        super().load_weights((n, t) for n, t in weights if not n.startswith(self.SKIPPED_PREFIXES))
