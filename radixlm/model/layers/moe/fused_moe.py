"""The experts' half of a MoE layer, after routing: for each expert touched, its tokens through
gate_up (w13 = [gate; up] rows), SiLU(gate) * up, down (w2), scaled by the routing weight and
summed per token. The torch path below is the reference and the path for non-CPU devices; the
native CPU op (registered by the kernels) computes the same on the quantized blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from radixlm.model.layers.moe.experts import ExpertWeights


def _expert_linear(x: torch.Tensor, w: ExpertWeights, e: int) -> torch.Tensor:
    if not w.quantized:
        return F.linear(x, w.data[e].to(x.dtype))
    from radixlm.kernels.ops import ops

    q = w.expert(e)
    return ops().qlinear(x.float().contiguous(), q.data.contiguous(), q.fmt.kernel_id, None).to(x.dtype)


def fused_experts_torch(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        w13: ExpertWeights, w2: ExpertWeights) -> torch.Tensor:
    """hidden [T, H], topk_weights [T, k] (already normalized as the model wants), topk_ids [T, k]
    -> [T, H]. One matmul per expert touched, over the tokens routed to it."""
    out = torch.zeros_like(hidden)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.num_experts).tolist()
    token_of = order // topk_ids.shape[1]
    weight_of = topk_weights.reshape(-1)[order]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        tokens = token_of[start:start + n]
        x = hidden.index_select(0, tokens)
        gate, up = _expert_linear(x, w13, e).chunk(2, dim=-1)
        y = _expert_linear(F.silu(gate) * up, w2, e)
        out.index_add_(0, tokens, y * weight_of[start:start + n, None].to(y.dtype))
        start += n
    return out


@dataclass(frozen=True)
class ExpertsPath:
    """Another way to compute fused_experts (a native op), taken when `supports` says so."""

    name: str
    supports: Callable[[torch.Tensor, ExpertWeights, ExpertWeights], bool]
    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ExpertWeights, ExpertWeights], torch.Tensor]


_PATHS: list[ExpertsPath] = []


def register_experts_path(path: ExpertsPath) -> None:
    _PATHS.append(path)


def fused_experts(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  w13: ExpertWeights, w2: ExpertWeights) -> torch.Tensor:
    """What a MoE layer calls: the first registered path that takes these weights, else torch."""
    for path in _PATHS:
        if path.supports(hidden, w13, w2):
            return path.run(hidden, topk_weights, topk_ids, w13, w2)
    return fused_experts_torch(hidden, topk_weights, topk_ids, w13, w2)
