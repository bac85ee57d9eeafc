"""The experts' half of a MoE layer, after routing: for each expert touched, its tokens through
gate_up (w13 = [gate; up] rows), SiLU(gate) * up, down (w2), scaled by the routing weight and
summed per token. The torch path below is the reference (and the path where no other applies); the
native CPU op computes the same on the quantized blocks, the Triton grouped GEMM on CUDA. A layer
picks its path once, from its weights' device and format (`experts_path`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.model.layers.activation import SiluAndMul
from radixlm.model.layers.moe.experts import ExpertWeights


def _expert_linear(x: torch.Tensor, w: ExpertWeights, e: int) -> torch.Tensor:
    if not w.quantized:
        return F.linear(x, w.data[e].to(x.dtype))
    from radixlm.kernels.ops import ops

    q = w.expert(e)
    return (
        ops()
        .qlinear(x.float().contiguous(), q.data.contiguous(), q.fmt.kernel_id, None)
        .to(x.dtype)
    )


def fused_experts_torch(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
) -> torch.Tensor:
    """hidden [T, H], topk_weights [T, k] (already normalized as the model wants), topk_ids [T, k]
    (-1: skipped) -> [T, H]. One matmul per expert touched, over the tokens routed to it."""
    T, k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    start = int(
        (flat_ids < 0).sum()
    )  # ids of -1 (an expert another rank holds) sort first: skipped
    counts = torch.bincount(flat_ids[order[start:]], minlength=w13.num_experts).tolist()
    rows = hidden.new_zeros(T * k, hidden.shape[-1])  # each (token, slot) pair's expert output
    for e, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start : start + n]
        x = hidden.index_select(0, pairs // k)
        # SiluAndMul: the dense MLP's SiLU (the native one on CPU float32, as the native op's).
        rows.index_copy_(0, pairs, _expert_linear(SiluAndMul()(_expert_linear(x, w13, e)), w2, e))
        start += n
    # A token sums its rows in slot order, mul then add (the native op's order): its output does not
    # depend on which other tokens share its experts.
    rows, weights = rows.view(T, k, -1), topk_weights.to(hidden.dtype)
    out = torch.zeros_like(hidden)
    for j in range(k):
        out = out + weights[:, j, None] * rows[:, j]
    return out


ExpertsFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, ExpertWeights, ExpertWeights], torch.Tensor
]


@dataclass(frozen=True)
class ExpertsPath:
    """Another way to compute fused_experts (a native op, a Triton kernel), taken when `supports`
    says so for the weights (and the device they are on)."""

    name: str
    supports: Callable[[torch.device, ExpertWeights, ExpertWeights], bool]
    run: ExpertsFn


_PATHS: list[ExpertsPath] = []


def register_experts_path(path: ExpertsPath) -> None:
    _PATHS.append(path)


def experts_path(device: torch.device, w13: ExpertWeights, w2: ExpertWeights) -> ExpertsFn:
    """The computation for these weights on `device`: the first registered path that takes them,
    else torch. A layer asks once (its weights do not move) and calls the answer every forward."""
    for path in _PATHS:
        if path.supports(device, w13, w2):
            return path.run
    return fused_experts_torch


def fused_experts(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
) -> torch.Tensor:
    """fused_experts through the path of these weights (for callers without a layer to keep it)."""
    return experts_path(hidden.device, w13, w2)(hidden, topk_weights, topk_ids, w13, w2)


# After the registry they join: the native CPU op, the Triton kernels on CUDA.
from radixlm.model.layers.moe import native as _native  # noqa: E402 (these modules register themselves in the registry defined above)
from radixlm.model.layers.moe import triton as _triton  # noqa: E402 (these modules register themselves in the registry defined above)

register_experts_path(ExpertsPath(_native.NAME, _native.supports, _native.run))
register_experts_path(ExpertsPath(_triton.NAME, _triton.supports, _triton.run))
