"""Routing of a MoE layer: each token's top-k experts and their weights from the router's logits.

Every family radixlm serves routes the same way (HF's TopKRouter): a softmax over all experts in
float32, the top k of it, then optionally those k renormalized to sum to 1. Renormalized top-k of
the full softmax equals a softmax over the top-k logits (Mixtral's formulation).

  family      renormalize                     extra
  Mixtral     always                          -
  Qwen2-MoE   config.norm_topk_prob (False)   a shared expert with a sigmoid gate (moe_block.py)
  Qwen3-MoE   config.norm_topk_prob (True in the released models)
  OLMoE       config.norm_topk_prob (False)

BiasedTopKRouting is the other kind: the choice is made on the scores plus a per-expert bias (the
auxiliary-loss-free balancing bias), the weights are the unbiased scores of the chosen experts.
  LFM2-MoE       sigmoid scores, `expert_bias`; renormalized over sum + 1e-6; routed_scaling_factor
  ERNIE 4.5 MoE  softmax scores, `e_score_correction_bias`; renormalized over max(sum, moe_norm_min)
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


@dataclass(frozen=True)
class BiasedTopKRouting:
    top_k: int
    scoring: str  # "sigmoid" | "softmax"
    renormalize: bool
    norm_add: float = 0.0  # the weights divided by max(sum + norm_add, norm_min)
    norm_min: float = 0.0
    scale: float = 1.0

    def __post_init__(self):
        if self.scoring not in ("sigmoid", "softmax"):
            raise ValueError(f"router scoring {self.scoring!r}: radixlm runs sigmoid or softmax")

    def select(
        self, router_logits: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E], bias [E] or None -> (weights float32 [T, k], ids int64 [T, k])."""
        logits = router_logits.float()
        scores = logits.sigmoid() if self.scoring == "sigmoid" else logits.softmax(dim=-1)
        choice = scores if bias is None else scores + bias.float()
        ids = torch.topk(choice, self.top_k, dim=-1)[1]
        weights = scores.gather(1, ids)
        if self.renormalize:
            total = weights.sum(dim=-1, keepdim=True) + self.norm_add
            weights = weights / total.clamp(min=self.norm_min)
        return weights * self.scale if self.scale != 1.0 else weights, ids


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    # float32 softmax and torch.topk, as HF does: the same ties break the same way.
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
