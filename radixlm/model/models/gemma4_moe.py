"""Gemma 4's routed experts (the A4B MoE models): a block beside each layer's dense MLP.

The router RMS-normalizes the layer's residual stream (no weight), scales it by a learned vector
and hidden ** -0.5, and takes the top-k of a softmax over the experts, renormalized to sum to 1 and
then multiplied by a learned per-expert scale. Each expert is a GELU-tanh gated MLP (HF's
`experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I], multiplied as rows W x).
The fused MoE paths run SiLU experts only, so these run here, one matmul pair per expert touched:
float weights through torch, a GGUF's block-quantized experts (`set_quantized`: ExpertWeights in
their blocks, never a float copy) through the native quantized linear kernel.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.layers.linear import Linear
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.norm import UnscaledRMSNorm


class Gemma4Router(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        hidden, experts = config.hidden_size, config.num_experts
        self.top_k = config.top_k_experts
        self.norm = UnscaledRMSNorm(hidden, config.rms_norm_eps)
        self.proj = Linear(hidden, experts)
        self.scale = nn.Parameter(torch.ones(hidden), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (weights [T, k] float32, expert ids [T, k])."""
        x = self.norm(x) * self.scale * (x.shape[-1] ** -0.5)
        probs = torch.softmax(self.proj(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids].float(), ids


class Gemma4MoeBlock(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.router = Gemma4Router(config)
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, h, i), requires_grad=False)
        self.quantized: dict[str, ExpertWeights] = {}  # set_quantized's, by parameter name
        self.routed = (e, config.top_k_experts)  # (what bench one-batch prices a step at)

    def set_quantized(self, name: str, w: ExpertWeights) -> None:
        """name: gate_up_proj or down_proj, kept in its blocks (8 rows interleaved where the format
        has such a layout); the float parameter goes."""
        self.quantized[name] = w.interleaved()
        getattr(self, name).data = torch.empty(0)

    def _project(self, name: str, e: int, x: torch.Tensor) -> torch.Tensor:
        w = self.quantized.get(name)
        if w is None:
            return F.linear(x, getattr(self, name)[e])
        from radixlm.kernels.ops import ops

        out = ops().qlinear(x.float().contiguous(), w.data[e], w.fmt.kernel_id, None)
        return out.to(x.dtype)

    def forward(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual: what the router reads; x: the experts' (normed) input; both [T, H]."""
        weights, ids = self.router(residual)
        out = torch.zeros_like(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        k, start = ids.shape[1], 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start : start + n]
            start += n
            tokens = pairs // k
            gate, up = self._project("gate_up_proj", expert, x[tokens]).chunk(2, dim=-1)
            y = self._project("down_proj", expert, F.gelu(gate, approximate="tanh") * up)
            y = y * weights.reshape(-1)[pairs, None].to(y.dtype)
            out.index_add_(0, tokens, y)
        return out
