"""Zero-computation experts (LongCat-Flash): router slots past the real experts whose "expert" is
the identity, so a token routed there gets its own input scaled by the routing weight.

They cost no matmul: zero_experts_compute takes their slots out of the routes (id -1, weight 0,
which every fused-MoE path skips: the torch loop, the native op and the Triton kernel) and returns
their output, the input times the sum of their weights, to add to the real experts' (SGLang's
zero_experts_compute_triton with zero_expert_type "identity").
"""

from __future__ import annotations

import torch


def zero_experts_compute(
    hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [T, H], weights [T, k] float32, ids [T, k] (ids >= num_experts: zero experts) ->
    (weights and ids with the zero experts' slots skipped, their output [T, H] in hidden's dtype).
    """
    zero = ids >= num_experts
    scale = torch.where(zero, weights, torch.zeros_like(weights)).sum(-1, keepdim=True)
    # a float32 product rounded to hidden's dtype, as HF's LongcatFlashExperts rounds its rows
    identity = (hidden * scale).to(hidden.dtype)
    return weights.masked_fill(zero, 0.0), ids.masked_fill(zero, -1), identity
