"""MiniMax-M2 (MiniMaxM2ForCausalLM; transformers' modeling_minimax_m2 is the reference).

The Llama graph (pre-norm, fused residual) with:
- attention: RMSNorm over the whole q and k projections (not per head; OLMoE's, moe_families.py's
  OlmoeAttention), then partial RoPE: the first rotary_dim (partial_rotary_factor) of each head's
  dims rotate, rotate_half layout;
- every layer a MoE of num_local_experts experts of width intermediate_size, no shared expert:
  sigmoid router scores, the choice biased by e_score_correction_bias, the k chosen weights the
  unbiased scores renormalized. That is DeepSeek-V3's noaux_tc routing with one group and no
  scaling, so the layer is deepseek_moe.py's DeepseekMoE on GLM-4.5's stack (glm4_moe.py).

Checkpoint names: MiniMax's own (what save_pretrained writes too):
`block_sparse_moe.{gate.weight, e_score_correction_bias, experts.E.w1/w3/w2.weight}`; transformers'
in-memory `mlp.{gate.weight, e_score_correction_bias, experts.gate_up_proj/down_proj}`; llama.cpp's
`minimax-m2` GGUF (ffn_*_exps stacked, exp_probs_b).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from torch import nn

from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.glm4_moe import Glm4MoeForCausalLM
from radixlm.model.models.moe import MoeDecoderLayer
from radixlm.model.models.moe_families import OlmoeAttention

_RENAMES = (
    (re.compile(r"\.block_sparse_moe\."), ".mlp."),
    (re.compile(r"\.mlp\.e_score_correction_bias$"), ".mlp.gate.e_score_correction_bias"),
    (re.compile(r"(\.mlp\.experts\.\d+)\.w1\."), r"\1.gate_proj."),
    (re.compile(r"(\.mlp\.experts\.\d+)\.w3\."), r"\1.up_proj."),
    (re.compile(r"(\.mlp\.experts\.\d+)\.w2\."), r"\1.down_proj."),
)


def check_minimax_m2_config(config: Any) -> None:
    """A variant this module would run wrongly: refused in one line naming the field."""
    refusals = (
        (getattr(config, "hidden_act", "silu") != "silu", "hidden_act", "only silu"),
        (getattr(config, "scoring_func", "sigmoid") != "sigmoid", "scoring_func", "only sigmoid"),
        (
            getattr(config, "qk_norm_type", "per_layer") != "per_layer",
            "qk_norm_type",
            "only per_layer (norms over the whole q and k projections)",
        ),
        (not getattr(config, "use_qk_norm", True), "use_qk_norm", "MiniMax-M2 always has them"),
        (getattr(config, "shared_intermediate_size", 0), "shared_intermediate_size", "only 0"),
    )
    for bad, key, why in refusals:
        if bad:
            raise ValueError(f"minimax_m2: {key} {getattr(config, key)!r} is not supported ({why})")


def routing_config(config: Any) -> SimpleNamespace:
    """The DeepSeek-V3 config fields DeepseekMoE reads, as MiniMax-M2's routing sets them."""
    return SimpleNamespace(
        n_routed_experts=config.num_local_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        hidden_size=config.hidden_size,
        moe_intermediate_size=config.intermediate_size,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
    )


class MiniMaxM2ForCausalLM(Glm4MoeForCausalLM):
    weight_renames = _RENAMES

    def build_model(self, config: Any) -> nn.Module:
        check_minimax_m2_config(config)
        return super().build_model(config)

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        attn = OlmoeAttention(config, layer_id, rotary_emb, qkv_bias=False, qk_norm=False)
        mlp = DeepseekMoE(routing_config(config), True, None, self.expert_dispatch)
        return MoeDecoderLayer(config, attn, mlp)
