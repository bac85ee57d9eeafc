"""The mixture-of-experts members of the Qwen3.5 family (qwen3_5.py's hybrid decoder with a sparse
MLP): Qwen3.5-MoE (HF Qwen3_5MoeForCausalLM, and the text model of
Qwen3_5MoeForConditionalGeneration) and Qwen3-Next (HF Qwen3NextForCausalLM).

Their experts are Qwen2-MoE's: softmax top-k renormalized, a shared expert scaled by
sigmoid(shared_expert_gate) (layers/moe/moe_block.py); Qwen3-Next keeps a dense MLP in
mlp_only_layers. Qwen3-Next stores its Gated DeltaNet projections fused and grouped by key head
(per key head: q, k, its value heads' v, their z; then per key head its b, a): load_weights regroups
the rows into Qwen3.5's order (all q, all k, all v, all z; all b, all a), so one layer runs both.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import torch
from torch import nn

from radixlm.model.layers.moe.expert_dispatch import expert_dispatch
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.models.llama import LlamaMLP
from radixlm.model.models.moe import MoeForCausalLM
from radixlm.model.models.qwen3_5 import Qwen3_5ForCausalLM

_NEXT_FUSED = re.compile(r"\.linear_attn\.(in_proj_qkvz|in_proj_ba)\.weight$")


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM, MoeForCausalLM):
    """MoeForCausalLM's expert loading over Qwen3.5's decoder (its build_model, name mapping)."""

    def build_model(self, config: Any) -> nn.Module:
        self.expert_dispatch = expert_dispatch()
        return Qwen3_5ForCausalLM.build_model(self, config)

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_experts,
            config.num_experts_per_tok,
            config.moe_intermediate_size,
            bool(getattr(config, "norm_topk_prob", True)),
        )

    def build_mlp(self, config: Any, layer_id: int) -> nn.Module:
        if not self.is_sparse(config, layer_id):
            return LlamaMLP(config.hidden_size, config.intermediate_size)
        shared = getattr(config, "shared_expert_intermediate_size", 0)
        return SparseMoeBlock(
            config.hidden_size,
            self.moe_spec(config),
            layer_id,
            shared_expert=LlamaMLP(config.hidden_size, shared) if shared else None,
            dispatch=self.expert_dispatch,
        )

    def forward(self, input_ids, positions, forward_batch):
        self.expert_dispatch.begin(input_ids.shape[0])
        return self.model(input_ids, positions, forward_batch)


class Qwen3NextForCausalLM(Qwen3_5MoeForCausalLM):
    def load_weights(self, weights) -> None:
        super().load_weights(pair for n, t in weights for pair in self._regrouped(n, t))

    def _regrouped(self, name: str, tensor) -> list[tuple[str, Any]]:
        """A fused projection grouped by key head -> Qwen3.5's separate parts (qkv and z; b and
        a), rows regrouped (whole rows move: exact for quantized rows too)."""
        m = _NEXT_FUSED.search(name)
        if m is None:
            return [(name, tensor)]
        cfg = self.config
        hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
        if m.group(1) == "in_proj_qkvz":
            dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
            parts, names = [dk, dk, r * dv, r * dv], ("in_proj_qkv", "in_proj_z")
        else:
            parts, names = [r, r], ("in_proj_b", "in_proj_a")
        width = sum(parts)
        order = torch.cat(
            [
                (torch.arange(hk)[:, None] * width + offset + torch.arange(n)).reshape(-1)
                for offset, n in zip(itertools.accumulate([0, *parts[:-1]]), parts)
            ]
        )
        split = hk * sum(parts[:-1]) if len(parts) == 4 else hk * parts[0]
        first, second = order[:split], order[split:]
        base = name.removesuffix(f"{m.group(1)}.weight")
        return [
            (base + f"{n}.weight", _rows(tensor, idx)) for n, idx in zip(names, (first, second))
        ]


def _rows(w, index: torch.Tensor):
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(w.data[index].contiguous(), w.fmt, w.cols)
    return w[index].contiguous()
