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


class ReLUSquared(nn.Module):
    """relu(x)² (HF's relu2: Arcee's and Nemotron-H's MLPs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class XIELU(nn.Module):
    """xIELU (Apertus; arXiv 2411.13010), HF's XIELUActivation: alpha_p x² + beta x for x > 0, else
    (expm1(min(x, eps)) - x) alpha_n + beta x, with alpha_p = softplus(a_p) and alpha_n = beta +
    softplus(a_n) from the checkpoint's raw parameters. beta and eps are HF's buffers: the
    checkpoint's values where it has them (stored in its dtype), else HF's defaults."""

    def __init__(self, beta: float = 0.5, eps: float = -1e-6):
        super().__init__()
        self.alpha_p = nn.Parameter(torch.empty(1))
        self.alpha_n = nn.Parameter(torch.empty(1))
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("eps", torch.tensor(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(
            x > 0,
            alpha_p * x * x + self.beta * x,
            (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x,
        )
