"""RMSNorm with an optional fused residual add (SGLang's calling convention)."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.kernels.ops import fused_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same op order as HF's LlamaRMSNorm (float32 statistics, weight applied
        # after casting back), so logits match the reference bit for bit in fp32.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x32.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """forward(x) -> normed x; forward(x, residual) -> (norm(x + residual), x + residual).

        The second form lets a decoder layer carry the residual stream without a
        separate add before every norm. With the fused ops (native on CPU float32, Triton on CUDA)
        it runs in place (x and residual are the caller's to give up: the layer's outputs and its
        own stream).
        """
        native = fused_ops(x) if x.dim() == 2 else None
        if native is not None:  # one fused pass instead of ~8 ops (and the add; Triton's on CUDA)
            scale = self.kernel_scale()
            if residual is None:
                return native.rmsnorm(x, scale, self.variance_epsilon)
            native.add_rmsnorm_(x, residual, scale, self.variance_epsilon)
            return x, residual
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def kernel_scale(self) -> torch.Tensor:
        """What the fused kernels multiply the normalized x by."""
        return self.weight


class UnscaledRMSNorm(RMSNorm):
    """RMS normalization without a learned weight (Gemma 4's v norm and router norm): the scale is
    fixed at 1 and nothing is loaded for it."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps)
        del self.weight
        self.register_buffer("weight", torch.ones(hidden_size), persistent=False)


class OffsetRMSNorm(RMSNorm):
    """x * (1 + w) computed as HF's Gemma / Qwen3.5 norms do it (float32 statistics, 1 + w in
    float32), with the weight stored as HF stores it (w, initialized at 0; llama.cpp's GGUF adds
    the 1 in: gguf/loader takes it off): the fused kernels multiply by `scale` = 1 + w, refreshed
    whenever weights are loaded (finish_loading)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps)
        nn.init.zeros_(self.weight)
        self.register_buffer("scale", torch.ones(hidden_size), persistent=False)

    def finish_loading(self) -> None:
        self.scale = 1.0 + self.weight.detach().float()

    def kernel_scale(self) -> torch.Tensor:
        return self.scale

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm without a bias, as HF's CohereLayerNorm computes it: float32 mean and variance,
    the weight applied in float32, cast back at the end (Command R / R7B)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        centered = x32 - x32.mean(-1, keepdim=True)
        x32 = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * x32).to(x.dtype)
