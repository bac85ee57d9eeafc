"""Jamba (HF JambaForCausalLM): a hybrid decoder whose layers are a Mamba-1 mixer
(model/layers/linear_attn/mamba1.py, with weighted RMS norms on dt, B and C) or attention (GQA
without any position encoding: Jamba's attention has no RoPE; layer i where i % attn_layer_period
== attn_layer_offset), each followed by a feed-forward that is a MoE (softmax over the router's
logits, top-k weights not renormalized; layer i where i % expert_layer_period ==
expert_layer_offset) or a SwiGLU MLP. Pre-norms input_layernorm and pre_ff_layernorm.

Checkpoint names: the feed-forward is `feed_forward` (read as MoeForCausalLM's `mlp`), its router
`feed_forward.router` (the block's gate), the experts stacked (transformers 5's
experts.gate_up_proj / down_proj) or per expert.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.mamba1 import Mamba1Dims, Mamba1Mixer
from radixlm.model.layers.moe.expert_dispatch import expert_dispatch, forward_idle
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.models.hybrid import HybridForCausalLM, build_layers, hybrid_layer_types
from radixlm.model.models.llama import LlamaMLP
from radixlm.model.models.moe import MoeForCausalLM
from radixlm.model.models.nemotron_h import NemotronHAttention

LAYER_TYPES = ("linear_attention", "full_attention")


def jamba_mamba_dims(config: Any) -> Mamba1Dims:
    if config.hidden_act != "silu":  # the mixer's conv and the MLPs' activation
        raise ValueError(f"Jamba hidden_act {config.hidden_act!r}: radixlm runs silu")
    return Mamba1Dims(
        hidden_size=config.hidden_size,
        intermediate=int(config.mamba_expand * config.hidden_size),
        state_size=config.mamba_d_state,
        conv_kernel=config.mamba_d_conv,
        dt_rank=int(config.mamba_dt_rank),
        conv_bias=bool(config.mamba_conv_bias),
        proj_bias=bool(config.mamba_proj_bias),
        bcdt_rms_eps=float(config.rms_norm_eps),
        bcdt_rms_weights=True,
    )


class JambaDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_type: str, index: int, layer_id: int, dispatch):
        """index: the layer's number among the layers of its type (its KV or state layer)."""
        super().__init__()
        self.is_linear = layer_type == "linear_attention"
        if self.is_linear:
            self.mamba = Mamba1Mixer(jamba_mamba_dims(config), index)
        else:
            self.self_attn = NemotronHAttention(config, index)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.layers_num_experts[layer_id] > 1:
            spec = MoeSpec(
                config.num_experts, config.num_experts_per_tok, config.intermediate_size, False
            )
            self.mlp = SparseMoeBlock(config.hidden_size, spec, layer_id, dispatch=dispatch)
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)

    def state_layer(self) -> Mamba1Mixer | None:
        return self.mamba if self.is_linear else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.mamba(hidden, fb) if self.is_linear else self.self_attn(hidden, fb)
        hidden, residual = self.pre_ff_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class JambaModel(DecoderStack):
    def __init__(self, config: Any, dispatch):
        super().__init__()
        self.init_stack(config, fused=False)
        self.dispatch = dispatch
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        self.embed_tokens = self.stage_embedding(config)
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: JambaDecoderLayer(config, t, n, i, dispatch),
            self.pp.layers,
        )
        self.final_layernorm = self.on_last(
            lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        )

    def final_norm(self, hidden, residual):
        return self.final_layernorm(hidden, residual)[0]

    def forward_idle(self) -> None:
        forward_idle(self.dispatch, [layer.mlp for layer in self.layers], self.stream_dtype())


class JambaForCausalLM(HybridForCausalLM, MoeForCausalLM):
    """MoeForCausalLM's expert loading over the hybrid decoder."""

    def build_hybrid_model(self, config: Any) -> nn.Module:
        self.expert_dispatch = expert_dispatch()
        return JambaModel(config, self.expert_dispatch)

    def _normalized(self, name: str) -> str:
        name = name.replace(".feed_forward.router.", ".feed_forward.gate.")
        return super()._normalized(name.replace(".feed_forward.", ".mlp."))
