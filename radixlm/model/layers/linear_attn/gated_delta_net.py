"""Gated DeltaNet (Qwen3.5, Qwen3-Next): linear attention whose per-head state follows the gated
delta rule, after a short causal conv over q, k and v, with a gated RMSNorm on the way out.

Module and parameter names follow HF's Qwen3_5GatedDeltaNet, except in_proj_qkv / in_proj_z ->
in_proj_qkvz and in_proj_b / in_proj_a -> in_proj_ba (one matmul each; the model's load_weights
fills the parts). The state: conv [K - 1, key_dim * 2 + value_dim] and ssm [Hv, Dk, Dv].

Value head h reads key head h // (Hv // Hk) (HF's grouped order, what the kernels assume), or,
where config.linear_value_heads_tiled (llama.cpp's Qwen3.5 GGUFs, gguf_qwen35.py), key head
h % Hk: q and k are then repeated to Hv heads in that order before the kernel. Every other
per-value-head tensor (z, a, b, A_log, dt_bias, the V channels, out_proj's columns) is in the
checkpoint's own order, so nothing else depends on it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.segments import run_state_layer
from radixlm.model.layers.parallel_linear import MergedColumnParallelLinear, RowParallelLinear


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """HF's (and FLA's) l2norm, in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's output, then times silu(z) (HF's Qwen3_5RMSNormGated)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32.to(dtype) * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: Any, state_layer_id: int):
        super().__init__()
        self.state_layer_id = state_layer_id
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"linear_num_value_heads {self.num_v_heads} must be a multiple of"
                f" linear_num_key_heads {self.num_k_heads}"
            )
        tiled = bool(getattr(config, "linear_value_heads_tiled", False))
        # the times q and k repeat (tiled) to the value heads; 1: the kernels group them
        self.tiled_repeat = self.num_v_heads // self.num_k_heads if tiled else 1
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel_size = config.linear_conv_kernel_dim
        hidden = config.hidden_size
        self.in_proj_qkvz = MergedColumnParallelLinear(hidden, [self.conv_dim, self.value_dim])
        self.in_proj_ba = MergedColumnParallelLinear(hidden, [self.num_v_heads] * 2)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel_size, groups=self.conv_dim, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(self.value_dim, hidden, what="linear value heads")

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[StateSpec]:
        return [
            StateSpec("conv", (self.kernel_size - 1, self.conv_dim), conv_dtype),
            StateSpec("ssm", (self.num_v_heads, self.head_k_dim, self.head_v_dim), ssm_dtype),
        ]

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        n = hidden.shape[0]
        mixed, z = self.in_proj_qkvz(hidden).split([self.conv_dim, self.value_dim], dim=-1)
        b, a = self.in_proj_ba(hidden).split([self.num_v_heads] * 2, dim=-1)
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        recurrence = lambda inputs, rows, lens: self._recurrence(fb, inputs, rows, lens)
        o = run_state_layer(fb, self.state_layer_id, [mixed, g, beta], recurrence)
        o = self.norm(o, z.reshape(n, self.num_v_heads, self.head_v_dim))
        return self.out_proj(o.reshape(n, self.value_dim))

    def _recurrence(
        self, fb: ForwardBatch, inputs: list[torch.Tensor], rows: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        mixed, g, beta = inputs
        n = mixed.shape[0]
        state = fb.state_pool.layer(self.state_layer_id)
        kernels = fb.linear_attn_backend
        weight = self.conv1d.weight.view(self.conv_dim, self.kernel_size)
        x = kernels.causal_conv1d(mixed, weight, None, state["conv"], rows, lens, "silu")
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(n, self.num_k_heads, self.head_k_dim)) * self.head_k_dim**-0.5
        k = l2norm(k.reshape(n, self.num_k_heads, self.head_k_dim))
        v = v.reshape(n, self.num_v_heads, self.head_v_dim)
        if self.tiled_repeat > 1:  # [T, Hk, D] -> [T, Hv, D], head h = key head h % Hk
            q, k = q.repeat(1, self.tiled_repeat, 1), k.repeat(1, self.tiled_repeat, 1)
        return kernels.gated_delta_rule(q, k, v, g, beta, state["ssm"], rows, lens)
