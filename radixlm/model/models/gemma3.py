"""Gemma 3 (text: Gemma3ForCausalLM / Gemma3TextConfig): the Gemma 2 graph with q/k norms
(OffsetRMSNorm over each head, before RoPE) and a RoPE per layer type: local (sliding) layers
rotate with rope_local_base_freq, global ones with rope_theta and the rope scaling. Gemma 3 has
no attention logit soft-capping (its config says None)."""

from __future__ import annotations

from typing import Any

from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.gemma2 import Gemma2ForCausalLM
from radixlm.model.models.llama import get_head_dim

LAYER_TYPES = ("sliding_attention", "full_attention")


def rope_params_of(config: Any, layer_type: str) -> dict:
    """The RoPE settings of one layer type. transformers 5 keeps them per layer type in
    config.rope_parameters; older configs have rope_theta + rope_scaling for global layers and
    rope_local_base_freq (unscaled) for local ones."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type in params:
        p = dict(params[layer_type])
    elif layer_type == "sliding_attention":
        p = {"rope_type": "default", "rope_theta": getattr(config, "rope_local_base_freq", 10000.0)}
    else:
        p = dict(getattr(config, "rope_scaling", None) or {})
        p.setdefault("rope_theta", getattr(config, "rope_theta", 1_000_000.0))
    p["rope_type"] = p.get("rope_type") or p.get("type") or "default"
    return p


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = True

    def rotary_embs(self, config: Any) -> list[RotaryEmbedding]:
        head_dim, max_pos = get_head_dim(config), config.max_position_embeddings
        ropes = {
            t: RotaryEmbedding(head_dim, max_pos, rope_params_of(config, t)) for t in LAYER_TYPES
        }
        return [ropes[t] for t in config.layer_types]
