"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.ops import fused_ops


class SiluAndMul(nn.Module):
    """silu(gate) * up on a fused [..., 2 * d] gate_up projection -> [..., d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        native = fused_ops(x) if x.dim() == 2 else None  # native on CPU float32, Triton on CUDA
        if native is not None:
            return native.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluAndMul(nn.Module):
    """gelu(gate) * up on a fused [..., 2 * d] gate_up projection -> [..., d]; approximate="tanh" is
    HF's gelu_pytorch_tanh (Gemma's hidden_activation)."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]
