"""GLM-4.5 / 4.6 / 4.5-Air (Glm4MoeForCausalLM; transformers' modeling_glm4_moe is the reference).

The Llama graph (pre-norm, fused residual) with:
- attention: q/k/v bias when attention_bias (o_proj never has one), optional per-head q/k RMSNorm
  (use_qk_norm), and partial RoPE: only the first partial_rotary_factor (0.5) of each head's dims
  rotate, in HF's rotate_half layout over that slice (layers/rotary.py's rotary_dim);
- the first first_k_dense_replace layers a dense MLP, the rest DeepSeek-V3's MoE (deepseek_moe.py):
  sigmoid router scores + e_score_correction_bias, grouped top-k (n_group, topk_group), the top-k
  weights renormalized (norm_topk_prob) and scaled by routed_scaling_factor, plus shared experts.

The multi-token-prediction layers (num_nextn_predict_layers, stored after num_hidden_layers) are
not run and their weights are skipped at load, as for DeepSeek-V3 (DeepseekV2ForCausalLM's
loader, which also reads every expert layout: per expert, transformers 5's stacked tensors, GGUF).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import get_tp_group
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, expert_dispatch
from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.deepseek_moe import DeepseekMoE, is_moe_layer
from radixlm.model.models.deepseek_v2 import DeepseekV3ForCausalLM
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from radixlm.model.models.moe import MoeDecoderLayer, MoeModel


class Glm4MoeForCausalLM(DeepseekV3ForCausalLM):
    # Llama's fused q/k/v and gate/up (DeepSeek's MLA keeps its projections apart).
    stacked_params_mapping = LlamaForCausalLM.stacked_params_mapping
    expert_dispatch: LocalExperts
    # (compiled pattern, replacement) applied to each checkpoint name before loading: a family
    # on this stack whose checkpoint names differ (MiniMax-M2, Hunyuan-MoE)
    weight_renames: tuple = ()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def renamed():
            for name, tensor in weights:
                for pattern, new in self.weight_renames:
                    name = pattern.sub(new, name)
                yield name, tensor

        super().load_weights(renamed() if self.weight_renames else weights)

    def build_model(self, config: Any) -> nn.Module:
        # DeepseekExperts hold whole experts (no tensor-parallel slices): the layouts DeepSeek
        # runs in (deepseek_v2.DeepseekV2Model) are the ones that hold.
        if get_tp_group().world_size > 1:
            raise ValueError(
                "GLM-4.5 runs with tp_size 1 for now (or over several ranks with"
                " --enable-dp-attention --dp-size N --tp-size N, and --ep-size N to split the"
                " experts; or in pipeline stages, --pp-size N)"
            )
        self.expert_dispatch = expert_dispatch()  # one for every MoE layer
        return MoeModel(config, self)

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        """MoeModel's per-layer hook: Llama attention, then a dense MLP or DeepSeek's MoE."""
        attn = self.build_attention(config, layer_id, rotary_emb)
        if is_moe_layer(config, layer_id):
            shared = (
                LlamaMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
                if getattr(config, "n_shared_experts", None)
                else None
            )
            mlp: nn.Module = DeepseekMoE(config, True, shared, self.expert_dispatch)
        else:
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        return MoeDecoderLayer(config, attn, mlp)

    def build_attention(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        """GLM's: q/k/v bias when attention_bias (never on o_proj), q/k norms when use_qk_norm.
        Families on this stack with another attention (dots1.py) override it."""
        return LlamaAttention(
            config,
            layer_id,
            rotary_emb,
            qkv_bias=bool(getattr(config, "attention_bias", False)),
            qk_norm=bool(getattr(config, "use_qk_norm", False)),
            o_bias=False,
        )
