"""Gated DeltaNet (Qwen3.5, Qwen3-Next): linear attention whose per-head state follows the gated
delta rule, after a short causal conv over q, k and v, with a gated RMSNorm on the way out.

Module and parameter names follow HF's Qwen3_5GatedDeltaNet, except in_proj_qkv / in_proj_z ->
in_proj_qkvz and in_proj_b / in_proj_a -> in_proj_ba (one matmul each; the model's load_weights
fills the parts). The state: conv [K - 1, key_dim * 2 + value_dim] and ssm [Hv, Dk, Dv].

Value head h reads key head h // (Hv // Hk) (HF's grouped order), or, where
config.linear_value_heads_tiled (llama.cpp's Qwen3.5 GGUFs, gguf/archs/qwen35.py), key head h % Hk:
the backend's gated_delta_rule_gated takes the order as `tiled` (its torch default repeats q and
k to Hv heads in that order; the native kernel indexes them). Every other
per-value-head tensor (z, a, b, A_log, dt_bias, the V channels, out_proj's columns) is in the
checkpoint's own order, so nothing else depends on it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.base import LinearAttnBackend
from radixlm.model.layers.linear_attn.segments import run_state_layer
from radixlm.model.layers.parallel_linear import MergedColumnParallelLinear, RowParallelLinear
from radixlm.model.layers.router_gemm import ROUTER_GEMM_MAX_ROWS, router_logits


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's output, then times silu(z) (HF's Qwen3_5RMSNormGated), by the
    linear-attention backend (LinearAttnBackend.gated_rmsnorm: torch's, or a fused kernel)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor, backend: LinearAttnBackend) -> torch.Tensor:
        return backend.gated_rmsnorm(x, z, self.weight, self.eps)


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
        # value head h reads key head h % Hk (tiled) or h // (Hv // Hk) (grouped)
        self.tiled = bool(getattr(config, "linear_value_heads_tiled", False))
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
        b, a = self._ba(hidden).split([self.num_v_heads] * 2, dim=-1)
        recurrence = lambda inputs, rows, lens: self._recurrence(fb, inputs, rows, lens)
        o = run_state_layer(fb, self.state_layer_id, [mixed, a, b], recurrence)
        z = z.reshape(n, self.num_v_heads, self.head_v_dim)
        o = self.norm(o, z, fb.linear_attn_backend)
        return self.out_proj(o.reshape(n, self.value_dim))

    def _ba(self, hidden: torch.Tensor) -> torch.Tensor:
        """in_proj_ba: a float32 [2 Hv, hidden] matrix, a router's size: a decode batch takes the
        native router_gemm (MKL's GEMV runs it on one thread), as qwen3_5_layers.cpp does."""
        p = self.in_proj_ba
        if p.qweight is None and p.bias is None and hidden.shape[0] <= ROUTER_GEMM_MAX_ROWS:
            return router_logits(hidden, p.weight)
        return p(hidden)

    def _recurrence(
        self, fb: ForwardBatch, inputs: list[torch.Tensor], rows: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        mixed, a, b = inputs
        n = mixed.shape[0]
        state = fb.state_pool.layer(self.state_layer_id)
        kernels = fb.linear_attn_backend
        weight = self.conv1d.weight.view(self.conv_dim, self.kernel_size)
        x = kernels.causal_conv1d(mixed, weight, None, state["conv"], rows, lens, "silu")
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(n, self.num_k_heads, self.head_k_dim)
        k = k.reshape(n, self.num_k_heads, self.head_k_dim)
        v = v.reshape(n, self.num_v_heads, self.head_v_dim)
        # gates, l2norms, the tiled key heads (h % Hk) and the rule: one call (a fused kernel)
        return kernels.gated_delta_rule_gated(
            q, k, v, a, b, self.A_log, self.dt_bias, state["ssm"], rows, lens, self.tiled
        )
