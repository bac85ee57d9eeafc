"""Routing of a MoE layer: each token's top-k experts and their weights from the router's logits.

Every family radixlm serves routes the same way (HF's TopKRouter): a softmax over all experts in
float32, the top k of it, then optionally those k renormalized to sum to 1. Renormalized top-k of
the full softmax equals a softmax over the top-k logits (Mixtral's formulation).

  family      renormalize                     extra
  Mixtral     always                          -
  Qwen2-MoE   config.norm_topk_prob (False)   a shared expert with a sigmoid gate (moe_block.py)
  Qwen3-MoE   config.norm_topk_prob (True in the released models)
  OLMoE       config.norm_topk_prob (False)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TopKRouting:
    top_k: int
    renormalize: bool

    def select(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E] -> (weights float32 [T, k], expert ids int64 [T, k])."""
        return select_experts(router_logits, self.top_k, self.renormalize)


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    # float32 softmax and torch.topk, as HF does: the same ties break the same way.
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
