"""The native CPU path of fused_experts: torch.ops.radixlm.fused_moe (kernels/csrc/moe.cpp) on the
experts' quantized blocks (every format qlinear reads, row-major or 8-row interleaved) or 16-bit
floats. fused_moe.py registers it; float32 weights and other devices keep the torch path.

The op computes what fused_experts_torch computes on the CPU, bitwise (same kernels, same SiLU,
each token's rows summed in slot order), as one op: tokens grouped by expert, one matmul per expert
touched for gate + up and one for down, only the chosen experts' bytes read."""

from __future__ import annotations

import torch

from radixlm.kernels import build
from radixlm.model.layers.moe.experts import ExpertWeights

NAME = "native"
# Tokens per op call: the op's buffers are [tokens * top_k, 2 * intermediate] and [tokens * top_k,
# hidden] float32 (a 8k-token prefill chunk of OLMoE would hold ~1.3 GB); a token's output does not
# depend on its batch, so slicing changes no value, and at 1024 tokens the experts' weights are
# re-read once per ~100 GFLOP.
MAX_TOKENS = 1024


def supports(device: torch.device, w13: ExpertWeights, w2: ExpertWeights) -> bool:
    if device.type != "cpu" or not (w13.quantized and w2.quantized):
        return False
    if w13.data.device.type != "cpu" or w2.data.device.type != "cpu":
        return False
    if w13.fmt.group > 1 and (w13.rows // 2) % w13.fmt.group:  # gate and up share a group of 8
        return False
    return build.load()


def run(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
) -> torch.Tensor:
    return run_with(hidden, topk_weights, topk_ids, w13, w2)


def run_with(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    activation: str = "silu",
    alpha: float = 0.0,
    limit: float = 0.0,
) -> torch.Tensor:
    """run, with SGLang's fused_experts options: per-expert biases b13 [E, 2I] ([gate; up] as
    w13's rows) and b2 [E, H], activation "silu" or "swiglu" (gpt-oss's, clamped at limit)."""
    from radixlm.kernels.ops import ops

    x = hidden.reshape(-1, hidden.shape[-1]).float().contiguous()
    k = topk_ids.shape[-1]
    ids, weights = topk_ids.reshape(x.shape[0], k), topk_weights.reshape(x.shape[0], k).float()
    parts = [
        ops().fused_moe(
            x[s : s + MAX_TOKENS],
            ids[s : s + MAX_TOKENS],
            weights[s : s + MAX_TOKENS],
            w13.data,
            w13.fmt.kernel_id,
            w2.data,
            w2.fmt.kernel_id,
            b13,
            b2,
            activation,
            alpha,
            limit,
        )
        for s in range(0, max(x.shape[0], 1), MAX_TOKENS)
    ]  # one call when empty
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.view(hidden.shape).to(hidden.dtype)
