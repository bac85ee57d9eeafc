"""DeepSeek's expert routing: which experts each token goes to and with what weight.

Three `topk_method`s, as DeepSeek's configs name them (and SGLang's `select_experts` runs them):
- greedy (V2): softmax over all experts, top-k.
- group_limited_greedy (V2, V2.5): softmax; experts split into n_group groups, a group scored by its
  best expert; only the topk_group best groups are eligible; top-k among them.
- noaux_tc (V3, R1): sigmoid scores; the choice adds e_score_correction_bias (the
auxiliary-loss-free
  balancing bias) and scores a group by the sum of its two best experts; the weights are the
  unbiased sigmoid scores of the chosen experts.
Then norm_topk_prob renormalizes the k weights (+1e-20 as V3) and routed_scaling_factor scales them.
Scores are float32 whatever the model dtype (transformers keeps the gate in float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch


class TopkMethod(str, Enum):
    GREEDY = "greedy"
    GROUP_LIMITED_GREEDY = "group_limited_greedy"
    NOAUX_TC = "noaux_tc"


@dataclass(frozen=True)
class DeepseekRouting:
    num_experts: int
    top_k: int
    method: TopkMethod
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok must be in 1..{self.num_experts}, got {self.top_k}"
            )
        if self.method != TopkMethod.GREEDY:
            if self.n_group < 1 or self.num_experts % self.n_group:
                raise ValueError(
                    f"n_group {self.n_group} must divide n_routed_experts {self.num_experts}"
                )
            if not 0 < self.topk_group <= self.n_group:
                raise ValueError(
                    f"topk_group must be in 1..n_group ({self.n_group}), got {self.topk_group}"
                )

    @staticmethod
    def from_config(config: Any, v3: bool) -> DeepseekRouting:
        """V3 configs route noaux_tc whatever topk_method says (transformers' DeepseekV3TopkRouter
        has only that method; DeepSeek's own configs name it)."""
        method = (
            TopkMethod.NOAUX_TC
            if v3
            else TopkMethod(getattr(config, "topk_method", None) or "greedy")
        )
        return DeepseekRouting(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            method=method,
            n_group=getattr(config, "n_group", None) or 1,
            topk_group=getattr(config, "topk_group", None) or 1,
            norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
            routed_scaling_factor=float(getattr(config, "routed_scaling_factor", None) or 1.0),
        )

    def _group_mask(self, scores: torch.Tensor, group_scores: torch.Tensor) -> torch.Tensor:
        """bool [T, E]: the experts of each token's topk_group best groups."""
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
        return mask.repeat_interleave(self.num_experts // self.n_group, dim=1)

    def select(
        self, router_logits: torch.Tensor, correction_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E] -> (weights float32 [T, k], expert ids int64 [T, k])."""
        logits = router_logits.float()
        per_group = self.num_experts // self.n_group
        if self.method == TopkMethod.NOAUX_TC:
            scores = logits.sigmoid()
            choice = scores if correction_bias is None else scores + correction_bias.float()
            group_scores = (
                choice.view(-1, self.n_group, per_group).topk(min(2, per_group), dim=-1)[0].sum(-1)
            )
            choice = choice.masked_fill(~self._group_mask(choice, group_scores), float("-inf"))
            ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, ids)
        else:
            scores = logits.softmax(dim=-1)
            if self.method == TopkMethod.GROUP_LIMITED_GREEDY:
                group_scores = scores.view(-1, self.n_group, per_group).max(dim=-1).values
                scores = scores.masked_fill(~self._group_mask(scores, group_scores), 0.0)
            weights, ids = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        if self.norm_topk_prob and self.top_k > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, ids
