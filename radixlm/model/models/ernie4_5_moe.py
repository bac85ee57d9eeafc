"""ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B, -300B-A47B; transformers'
modeling_ernie4_5_moe is the reference): dense ERNIE 4.5's attention (ernie4_5.py: `use_bias` on
q/k/v/o, RoPE over interleaved pairs, q / k rows reordered at load) and, in the layers i with
moe_layer_start_index <= i <= moe_layer_end_index and (i + 1) % moe_layer_interval == 0, a MoE:
a float32 softmax router, the experts chosen on score + e_score_correction_bias (HF's
`moe_statics`; the weights the unbiased scores), those renormalized over max(sum, moe_norm_min),
no scaling; moe_num_experts SwiGLU experts of moe_intermediate_size, plus moe_num_shared_experts
always-on experts as one ungated MLP (`shared_experts`, width moe_intermediate_size * their count)
added (layers/moe/moe_block.BiasedMoeBlock). The other layers: a dense MLP of intermediate_size.

Checkpoint names: Baidu's and save_pretrained's `mlp.experts.E.{gate,up,down}_proj.weight`,
`mlp.gate.weight`, `mlp.moe_statics.e_score_correction_bias` [1, experts],
`mlp.shared_experts.*`; transformers' in-memory stacked experts and
`mlp.gate.moe_statics.e_score_correction_bias`; llama.cpp's `ernie4_5-moe` GGUF (the bias as
exp_probs_b.bias: gguf/archs/ernie.py). The multi-token-prediction tensors (`mtp_*`, which
transformers does not run either) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model.layers.moe.moe_block import BiasedMoeBlock, MoeSpec
from radixlm.model.layers.moe.topk import BiasedTopKRouting
from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.ernie4_5 import reordered_qk
from radixlm.model.models.llama import LlamaAttention, LlamaMLP, get_head_dim
from radixlm.model.models.moe import MoeDecoderLayer, MoeForCausalLM
from radixlm.model.models.seed_oss import check_silu

# Every spelling of the choice's bias (a checkpoint's, transformers' in-memory, a GGUF's).
_BIAS_RE = re.compile(r"\.mlp\.(?:gate\.)?moe_statics\.e_score_correction(?:_bias|\.bias)$")
_MTP_RE = re.compile(r"^(?:model\.)?mtp_")


def check_ernie4_5_moe_config(config: Any) -> None:
    """A variant this module would run wrongly: refused in one line naming the field."""
    check_silu(config)
    experts, top_k = config.moe_num_experts, config.moe_k
    if not 0 < top_k <= experts:
        raise ValueError(f"ernie4_5_moe: moe_k {top_k} must be in 1..{experts}")
    if config.moe_layer_interval < 1:
        raise ValueError(f"ernie4_5_moe: moe_layer_interval {config.moe_layer_interval} < 1")


class Ernie4_5_MoeForCausalLM(MoeForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        check_ernie4_5_moe_config(config)
        return super().build_model(config)

    def is_sparse(self, config: Any, layer_id: int) -> bool:
        return (
            (layer_id + 1) % config.moe_layer_interval == 0
            and config.moe_layer_start_index <= layer_id <= config.moe_layer_end_index
        )

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        bias = bool(config.use_bias)
        attn = LlamaAttention(
            config, layer_id, rotary_emb, qkv_bias=bias, qk_norm=False, o_bias=bias
        )
        if not self.is_sparse(config, layer_id):
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size, bias=bias)
            return MoeDecoderLayer(config, attn, mlp)
        inter, shared = config.moe_intermediate_size, config.moe_num_shared_experts or 0
        spec = MoeSpec(config.moe_num_experts, config.moe_k, inter, True)
        routing = BiasedTopKRouting(config.moe_k, "softmax", True, norm_min=config.moe_norm_min)
        block = BiasedMoeBlock(
            config.hidden_size,
            spec,
            layer_id,
            routing,
            shared_experts=LlamaMLP(config.hidden_size, inter * shared, bias=bias)
            if shared
            else None,
            dispatch=self.expert_dispatch,
        )
        return MoeDecoderLayer(config, attn, block)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def renamed():
            for name, tensor in weights:
                if _MTP_RE.match(name):
                    continue
                if _BIAS_RE.search(name):  # [1, experts] in HF's checkpoints
                    name, tensor = _BIAS_RE.sub(".mlp.expert_bias", name), tensor.reshape(-1)
                yield name, tensor

        super().load_weights(reordered_qk(renamed(), get_head_dim(self.config)))
