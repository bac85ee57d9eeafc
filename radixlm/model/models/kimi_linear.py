"""Kimi-Linear (HF KimiLinearForCausalLM; transformers' kimi_linear is the reference): a hybrid
decoder whose config.layer_types mark each layer linear_attention (Kimi Delta Attention:
layers/linear_attn/kimi_delta_attention.py, a recurrent state per request) or full_attention
(DeepSeek's multi-head latent attention without RoPE: the decoupled key's qk_rope_head_dim part is
kept, unrotated, so the latent pool stores it as DeepSeek's; the softmax scale qk_head_dim^-0.5).
config.mlp_layer_types marks each MLP dense (a SwiGLU of intermediate_size) or sparse (DeepSeek-V3's
MoE: sigmoid scores, e_score_correction_bias, grouped top-k, routed_scaling_factor, shared experts).
Plain RMSNorms (weight, not 1 + weight).

Checkpoint names: Moonshot's (what save_pretrained writes): block_sparse_moe.experts.E.w1/w3/w2,
block_sparse_moe.gate / shared_experts, self_attn.q_conv1d / k_conv1d / v_conv1d, self_attn.A_log
([1, 1, heads, 1]); transformers' in-memory names are taken too (mlp.experts.gate_up_proj /
down_proj, self_attn.conv1d, self_attn.forget_gate.*).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.kimi_delta_attention import KimiDeltaAttention
from radixlm.model.layers.moe.expert_dispatch import expert_dispatch, forward_idle
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.deepseek_v2 import DeepseekV2Attention, DeepseekV2ForCausalLM
from radixlm.model.models.hybrid import (
    HybridDecoderLayer,
    HybridForCausalLM,
    build_layers,
    hybrid_layer_types,
)
from radixlm.model.models.llama import LlamaMLP
from radixlm.model.models.smollm3 import NoRope

LAYER_TYPES = ("linear_attention", "full_attention")

_RENAMES = (
    (".block_sparse_moe.", ".mlp."),
    (".self_attn.forget_gate.", ".self_attn."),
)
_MIXTRAL_EXPERT = re.compile(r"\.experts\.(\d+)\.w([123])\.weight$")
_EXPERT_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}
_KDA_PROJ = re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight$")
_KDA_CONV = re.compile(r"^(model\.layers\.\d+\.self_attn\.)([qkv])_conv1d\.weight$")


def moe_config(config: Any) -> SimpleNamespace:
    """The DeepSeek-V3 names DeepseekMoE reads, from Kimi's config (transformers maps Kimi's own
    num_experts / moe_renormalize / num_expert_group onto these through attribute_map)."""
    return SimpleNamespace(
        n_routed_experts=config.num_local_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        n_group=config.n_group,
        topk_group=config.topk_group,
        norm_topk_prob=config.norm_topk_prob,
        routed_scaling_factor=config.routed_scaling_factor,
        hidden_size=config.hidden_size,
        moe_intermediate_size=config.moe_intermediate_size,
    )


class KimiLinearDecoderLayer(HybridDecoderLayer):
    def __init__(self, config: Any, layer_type: str, index: int, mlp: nn.Module):
        """index: the layer's number among the layers of its type (its KV or state layer)."""
        super().__init__()
        self.is_linear = layer_type == "linear_attention"
        self.self_attn = (
            KimiDeltaAttention(config, index)
            if self.is_linear
            else DeepseekV2Attention(config, index, NoRope(), interleaved_rope=False)
        )
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def state_layer(self) -> KimiDeltaAttention | None:
        return self.self_attn if self.is_linear else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        hidden, residual = self.mix(positions, hidden, fb, residual)
        return self.mlp(hidden), residual


class KimiLinearModel(DecoderStack):
    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        self.dispatch = expert_dispatch()  # one for every MoE layer
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        mlp_types = list(config.mlp_layer_types)
        moe = moe_config(config)

        def mlp(i: int) -> nn.Module:
            if mlp_types[i] == "dense":
                return LlamaMLP(config.hidden_size, config.intermediate_size)
            if mlp_types[i] != "sparse":
                raise ValueError(f"mlp_layer_types[{i}] = {mlp_types[i]!r}: dense or sparse")
            shared = config.moe_intermediate_size * (config.n_shared_experts or 0)
            shared_mlp = LlamaMLP(config.hidden_size, shared) if shared else None
            return DeepseekMoE(moe, True, shared_mlp, self.dispatch)

        self.embed_tokens = self.stage_embedding(config)
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: KimiLinearDecoderLayer(config, t, n, mlp(i)),
            self.pp.layers,
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def forward_idle(self) -> None:
        forward_idle(self.dispatch, [layer.mlp for layer in self.layers], self.stream_dtype())


class KimiLinearForCausalLM(HybridForCausalLM, DeepseekV2ForCausalLM):
    """DeepseekV2ForCausalLM's loading (stacked experts, kv_b_proj) over the hybrid decoder."""

    def build_hybrid_model(self, config: Any) -> nn.Module:
        return KimiLinearModel(config)

    def load_weights(self, weights) -> None:
        super().load_weights(self._renamed(weights))

    def _renamed(self, weights):
        """Moonshot's names -> the loader's; the three convs of a KDA layer joined into one."""
        convs: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            for old, new in _RENAMES:
                name = name.replace(old, new)
            m = _MIXTRAL_EXPERT.search(name)
            if m:
                proj = _EXPERT_PROJ[m.group(2)]
                name = name[: m.start()] + f".experts.{m.group(1)}.{proj}.weight"
            if name.endswith(".self_attn.A_log"):
                tensor = tensor.reshape(-1)
            m = _KDA_CONV.match(name)
            if m:
                parts = convs.setdefault(m.group(1), {})
                parts[m.group(2)] = tensor
                if len(parts) == 3:
                    yield m.group(1) + "conv1d.weight", torch.cat([parts[c] for c in "qkv"])
                    del convs[m.group(1)]
                continue
            yield name, tensor
        if convs:
            raise ValueError(f"KDA convolutions without all of q, k, v: {sorted(convs)}")

    def _map_name(self, name: str) -> tuple[str, int | None]:
        # A KDA layer's q/k/v go into its fused qkv_proj; an MLA layer keeps its q_proj.
        m = _KDA_PROJ.match(name)
        if m and self.model.layer_types[int(m.group(1))] == "linear_attention":
            return name.replace(f".{m.group(2)}_proj.", ".qkv_proj."), "qkv".index(m.group(2))
        return super()._map_name(name)
