"""LFM2-MoE (HF Lfm2MoeForCausalLM: LFM2-8B-A1B, LFM2-24B-A2B; transformers' modeling_lfm2_moe is
the reference): LFM2's hybrid decoder (lfm2.py: gated short-conv or attention layers, pre-norms
operator_norm / ffn_norm, the final embedding_norm) whose first num_dense_layers feed-forwards are
a SwiGLU MLP of intermediate_size (no ff-dim adjustment, unlike LFM2's) and the others a MoE:
sigmoid router scores, the experts chosen on score + expert_bias (use_expert_bias), the chosen
scores renormalized over sum + 1e-6 (norm_topk_prob) and times routed_scaling_factor; num_experts
SwiGLU experts of moe_intermediate_size, no shared expert (layers/moe/moe_block.BiasedMoeBlock).

Checkpoint names: what save_pretrained writes (LiquidAI's files too): feed_forward.{w1, w3, w2} in
the dense layers, feed_forward.{gate.weight, expert_bias, experts.E.{w1, w3, w2}.weight} in the MoE
ones: Mixtral's names under `feed_forward`, read as MoeForCausalLM reads Mixtral's; transformers'
in-memory stacked experts.gate_up_proj / down_proj too; llama.cpp's `lfm2moe` GGUF
(gguf/archs/hybrid_ssm.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.layers.moe.expert_dispatch import expert_dispatch, forward_idle
from radixlm.model.layers.moe.moe_block import BiasedMoeBlock, MoeSpec
from radixlm.model.layers.moe.topk import BiasedTopKRouting
from radixlm.model.models.hybrid import HybridForCausalLM
from radixlm.model.models.lfm2 import Lfm2DecoderLayer, Lfm2Model
from radixlm.model.models.llama import LlamaMLP
from radixlm.model.models.moe import MoeForCausalLM


def check_lfm2_moe_config(config: Any) -> None:
    """A variant this module would run wrongly: refused in one line naming the field."""
    experts, top_k = config.num_experts, config.num_experts_per_tok
    if not 0 < top_k <= experts:
        raise ValueError(f"lfm2_moe: num_experts_per_tok {top_k} must be in 1..{experts}")
    dense = config.num_dense_layers
    if not 0 <= dense <= config.num_hidden_layers:
        raise ValueError(
            f"lfm2_moe: num_dense_layers {dense} must be in 0..{config.num_hidden_layers}"
        )


class Lfm2MoeDecoderLayer(Lfm2DecoderLayer):
    FFN = "mlp"  # where MoeForCausalLM's loader looks for a layer's experts


class Lfm2MoeModel(Lfm2Model):
    def __init__(self, config: Any, family: Lfm2MoeForCausalLM):
        super().__init__(config, Lfm2MoeDecoderLayer, lambda i: family.build_ffn(config, i))
        self.dispatch = family.expert_dispatch

    def forward_idle(self) -> None:
        mlps = [getattr(layer, "mlp", None) for layer in self.layers]
        forward_idle(self.dispatch, mlps, self.stream_dtype())


class Lfm2MoeForCausalLM(HybridForCausalLM, MoeForCausalLM):
    """MoeForCausalLM's expert loading over LFM2's hybrid decoder."""

    def build_hybrid_model(self, config: Any) -> nn.Module:
        check_lfm2_moe_config(config)
        self.expert_dispatch = expert_dispatch()  # one for every MoE layer
        return Lfm2MoeModel(config, self)

    def build_ffn(self, config: Any, layer_id: int) -> nn.Module:
        if layer_id < config.num_dense_layers:
            return LlamaMLP(config.hidden_size, config.intermediate_size)
        renormalize = bool(config.norm_topk_prob)
        spec = MoeSpec(
            config.num_experts,
            config.num_experts_per_tok,
            config.moe_intermediate_size,
            renormalize,
        )
        routing = BiasedTopKRouting(
            config.num_experts_per_tok,
            "sigmoid",
            renormalize,
            norm_add=1e-6,
            scale=float(config.routed_scaling_factor),
        )
        return BiasedMoeBlock(
            config.hidden_size,
            spec,
            layer_id,
            routing,
            has_bias=bool(config.use_expert_bias),
            dispatch=self.expert_dispatch,
        )

    def _normalized(self, name: str) -> str:
        # LFM2's feed-forward names are Mixtral's (w1 gate, w3 up, w2 down) under `feed_forward`
        return super()._normalized(name.replace(".feed_forward.", ".block_sparse_moe."))
