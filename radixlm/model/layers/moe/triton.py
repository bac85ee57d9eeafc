"""The CUDA path of fused_experts: the Triton grouped GEMM over the pairs sorted by expert
(kernels/triton_ops/fused_moe.py). fused_moe.py registers it; it takes float experts on a CUDA
device (a GGUF's experts are dequantized to the model dtype there, model/loader.py)."""

from __future__ import annotations

import torch

from radixlm.kernels import triton_ops
from radixlm.model.layers.moe.experts import ExpertWeights

NAME = "triton"


def supports(device: torch.device, w13: ExpertWeights, w2: ExpertWeights) -> bool:
    if device.type != "cuda" or w13.quantized or w2.quantized:
        return False
    return triton_ops.available(device)


def run(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
) -> torch.Tensor:
    from radixlm.kernels.triton_ops.fused_moe import fused_experts_triton

    return fused_experts_triton(
        hidden, topk_weights, topk_ids, w13.data.to(hidden.dtype), w2.data.to(hidden.dtype)
    )
