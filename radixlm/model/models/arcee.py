"""Arcee AFM (ArceeForCausalLM) and Apertus (ApertusForCausalLM): the Llama graph whose MLP has no
gate (models/llama.py: GatelessMLP, down(act(up(x)))). Arcee's activation is ReLU²; Apertus' is
xIELU (layers/activation.py: XIELU, with each layer's learned alpha_p / alpha_n), with Qwen3's
per-head q/k norms and its pre-norms named attention_layernorm / feedforward_layernorm."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model.layers.activation import XIELU, ReLUSquared
from radixlm.model.models.llama import (
    GatelessMLP,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


def _activation(config: Any, supported: dict) -> nn.Module:
    act = getattr(config, "hidden_act", None)
    if act not in supported:
        raise ValueError(
            f"{config.architectures[0]} hidden_act {act!r}: radixlm runs {', '.join(supported)}"
        )
    return supported[act]()


def gateless_model(config: Any, act: dict, qk_norm: bool) -> LlamaModel:
    """Llama's layers with GatelessMLP(act) (and per-head q/k norms where qk_norm)."""
    bias = bool(getattr(config, "mlp_bias", False))

    def layer(i: int, rope) -> nn.Module:
        attn = LlamaAttention(config, i, rope, qkv_bias=False, qk_norm=qk_norm)
        act_fn = _activation(config, act)
        mlp = GatelessMLP(config.hidden_size, config.intermediate_size, act_fn, bias)
        return LlamaDecoderLayer(config, i, rope, self_attn=attn, mlp=mlp)

    model = LlamaModel(config, build_layer=layer)
    model.use_fused_layers = False  # the one-op decoder runs SiLU-gated MLPs only
    return model


class GatelessForCausalLM(LlamaForCausalLM):
    # q/k/v fused as Llama's; up_proj is a layer of its own (no gate to stack it with)
    stacked_params_mapping = [
        m for m in LlamaForCausalLM.stacked_params_mapping if m[0] == "qkv_proj"
    ]


class ArceeForCausalLM(GatelessForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        return gateless_model(config, {"relu2": ReLUSquared}, qk_norm=False)


class ApertusForCausalLM(GatelessForCausalLM):
    # HF's names of the two pre-norms -> Llama's layer's
    NORMS = {
        ".attention_layernorm.": ".input_layernorm.",
        ".feedforward_layernorm.": ".post_attention_layernorm.",
    }

    def build_model(self, config: Any) -> nn.Module:
        return gateless_model(config, {"xielu": XIELU}, qk_norm=True)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        for hf, ours in self.NORMS.items():
            name = name.replace(hf, ours)
        return super()._map_name(name)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """xIELU's beta and eps are buffers (HF's defaults where the checkpoint has none)."""
        buffers = dict(self.named_buffers())

        def params():
            for name, tensor in weights:
                if name.endswith((".act_fn.beta", ".act_fn.eps")):
                    if name in buffers:  # (another pipeline stage's layer: not here)
                        buffers[name].copy_(tensor.reshape(()))
                    continue
                yield name, tensor

        super().load_weights(params())
