"""EXAONE 4.0 (Exaone4ForCausalLM): OLMo 3's post-norm layers (each branch normalized after it,
before it joins the stream; no pre-norms) with Qwen3's per-head q/k norms, and hybrid attention:
where config.sliding_window is set, the windowed layers (config.layer_types) rotate q/k and the
global ones use no position encoding at all (HF: "global NoPE"); without a window every layer is
global and rotates."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import get_rope
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, get_head_dim
from radixlm.model.models.olmo3 import Olmo3DecoderLayer
from radixlm.model.models.smollm3 import NoRope


def exaone4_rotates(config: Any, layer_id: int) -> bool:
    """HF's Exaone4Attention: RoPE unless the model has a window and this layer is global."""
    return config.sliding_window is None or config.layer_types[layer_id] == "sliding_attention"


def check_exaone4_config(config: Any) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"Exaone4 hidden_act {act!r}: radixlm runs 'silu'")
    types = getattr(config, "layer_types", None)
    if types is None or len(types) != config.num_hidden_layers:
        raise ValueError(
            f"Exaone4 layer_types must name each of the {config.num_hidden_layers}"
            f" layers, got {types!r}"
        )
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise ValueError(
            f"Exaone4 layer_types {sorted(unknown)}: radixlm runs sliding_attention"
            " and full_attention"
        )


class Exaone4Model(DecoderStack):
    residual_stream = False  # post-norm layers add their branches themselves

    def __init__(self, config: Any):
        super().__init__()
        check_exaone4_config(config)
        self.init_stack(config, fused=False)
        self.embed_tokens = self.stage_embedding(config)
        rope, no_rope = get_rope(get_head_dim(config), config), NoRope()

        def layer(i: int) -> nn.Module:
            rotary = rope if exaone4_rotates(config, i) else no_rope
            attn = LlamaAttention(config, i, rotary, qkv_bias=False, qk_norm=True)
            return Olmo3DecoderLayer(config, i, rotary, self_attn=attn)

        self.layers = self.stage_layers(config.num_hidden_layers, layer)
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))


class Exaone4ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        return Exaone4Model(config)
