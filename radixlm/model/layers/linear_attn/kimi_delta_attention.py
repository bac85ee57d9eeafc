"""Kimi Delta Attention (KDA, Kimi-Linear's linear-attention layer): Gated DeltaNet whose decay
gate is per key channel, not one scalar per head (kda_rule.py has the recurrence).

Per token: q, k, v = the projections, each through a short causal conv (silu); beta =
sigmoid(b_proj(x)) per head; the log decay g = -exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias)
per channel (a low-rank gate); q, k l2-normalized, q times Dk^-0.5; after the rule, an RMSNorm
per head times sigmoid(g_b(g_a(x))) (sigmoid: not Gated DeltaNet's silu), then o_proj. Heads of q,
k and v are as many and as wide (linear_num_heads x linear_head_dim).

Parameter names follow the checkpoint's (Moonshot's, which transformers' save_pretrained writes):
q_proj / k_proj / v_proj load into one qkv_proj, q_conv1d / k_conv1d / v_conv1d into one conv1d
(their loader: models/kimi_linear.py). The state: conv [K - 1, 3 x heads x head_dim] (q's channels,
then k's, then v's) and ssm [heads, head_dim, head_dim].
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear import Linear
from radixlm.model.layers.linear_attn.base import _l2norm
from radixlm.model.layers.linear_attn.segments import run_state_layer
from radixlm.model.layers.parallel_linear import MergedColumnParallelLinear, RowParallelLinear


class SigmoidGatedRMSNorm(nn.Module):
    """HF's KimiLinearRMSNormGated: RMSNorm (float32, weight in float32) times sigmoid(gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32 * torch.sigmoid(gate.float())).to(x.dtype)


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: Any, state_layer_id: int):
        super().__init__()
        self.state_layer_id = state_layer_id
        self.num_heads = config.linear_num_heads
        self.head_dim = config.linear_head_dim
        self.dim = d = self.num_heads * self.head_dim
        self.kernel_size = config.linear_conv_kernel_dim
        hidden = config.hidden_size
        self.qkv_proj = MergedColumnParallelLinear(hidden, [d, d, d])
        self.conv1d = nn.Conv1d(3 * d, 3 * d, self.kernel_size, groups=3 * d, bias=False)
        self.f_a_proj = Linear(hidden, self.head_dim)
        self.f_b_proj = Linear(self.head_dim, d)
        self.dt_bias = nn.Parameter(torch.zeros(d, dtype=torch.float32))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32))
        self.b_proj = Linear(hidden, self.num_heads)
        self.g_a_proj = Linear(hidden, self.head_dim)
        self.g_b_proj = Linear(self.head_dim, d)
        self.o_norm = SigmoidGatedRMSNorm(self.head_dim, config.rms_norm_eps)
        self.o_proj = RowParallelLinear(d, hidden, what="linear_num_heads")

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[StateSpec]:
        return [
            StateSpec("conv", (self.kernel_size - 1, 3 * self.dim), conv_dtype),
            StateSpec("ssm", (self.num_heads, self.head_dim, self.head_dim), ssm_dtype),
        ]

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        n = hidden.shape[0]
        shape = (n, self.num_heads, self.head_dim)
        # the decay and write strength in float32 (they go through exp and sigmoid)
        g = self.f_b_proj(self.f_a_proj(hidden)).float() + self.dt_bias.float()
        g = -self.A_log.float().exp()[:, None] * F.softplus(g.view(shape))
        beta = self.b_proj(hidden).float().sigmoid()
        recurrence = lambda inputs, rows, lens: self._recurrence(fb, inputs, rows, lens)
        o = run_state_layer(fb, self.state_layer_id, [self.qkv_proj(hidden), g, beta], recurrence)
        gate = self.g_b_proj(self.g_a_proj(hidden)).view(shape)
        return self.o_proj(self.o_norm(o, gate).reshape(n, self.dim))

    def _recurrence(
        self, fb: ForwardBatch, inputs: list[torch.Tensor], rows: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        mixed, g, beta = inputs
        n = mixed.shape[0]
        state = fb.state_pool.layer(self.state_layer_id)
        kernels = fb.linear_attn_backend
        weight = self.conv1d.weight.view(3 * self.dim, self.kernel_size)
        x = kernels.causal_conv1d(mixed, weight, None, state["conv"], rows, lens, "silu")
        q, k, v = (t.reshape(n, self.num_heads, self.head_dim) for t in x.split(self.dim, -1))
        q = _l2norm(q) * self.head_dim**-0.5
        return kernels.kimi_delta_rule(q, _l2norm(k), v, g, beta, state["ssm"], rows, lens)
