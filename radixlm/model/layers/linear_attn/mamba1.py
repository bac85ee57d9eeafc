"""The Mamba-1 mixer (HF MambaMixer: MambaForCausalLM; FalconMambaForCausalLM with its weightless
RMS norms on dt, B and C; JambaMambaMixer with weighted ones): in_proj gives x and the gate z; a
causal conv (silu) over x with its conv state; x_proj gives dt's low-rank input, B and C; dt_proj
and softplus give one dt per channel; the selective scan (LinearAttnBackend.selective_scan) with
its diagonal A per channel plus the D skip, times silu(z); out_proj.

Parameter names follow HF's (in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj). The state:
conv [K - 1, intermediate] and ssm [intermediate, state_size].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.segments import run_state_layer
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear


@dataclass(frozen=True)
class Mamba1Dims:
    """A Mamba-1 mixer's sizes and switches (each family names them in its config)."""

    hidden_size: int
    intermediate: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool
    # dt's input, B and C RMS-normed with this epsilon (FalconMamba; Jamba); None: not normed
    bcdt_rms_eps: float | None = None
    bcdt_rms_weights: bool = False  # with weights (Jamba's dt_layernorm, b_ / c_layernorm)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Mamba1Mixer(nn.Module):
    def __init__(self, dims: Mamba1Dims, state_layer_id: int):
        super().__init__()
        self.dims = d = dims
        self.state_layer_id = state_layer_id
        self.in_proj = ColumnParallelLinear(d.hidden_size, 2 * d.intermediate, bias=d.proj_bias)
        self.conv1d = nn.Conv1d(
            d.intermediate, d.intermediate, d.conv_kernel, groups=d.intermediate, bias=d.conv_bias
        )
        self.x_proj = ColumnParallelLinear(d.intermediate, d.dt_rank + 2 * d.state_size)
        self.dt_proj = ColumnParallelLinear(d.dt_rank, d.intermediate, bias=True)
        self.A_log = nn.Parameter(torch.zeros(d.intermediate, d.state_size))
        self.D = nn.Parameter(torch.ones(d.intermediate))
        self.out_proj = RowParallelLinear(
            d.intermediate, d.hidden_size, bias=d.proj_bias, what="Mamba intermediate_size"
        )
        if d.bcdt_rms_weights:
            eps = d.bcdt_rms_eps
            self.dt_layernorm = RMSNorm(d.dt_rank, eps=eps)
            self.b_layernorm = RMSNorm(d.state_size, eps=eps)
            self.c_layernorm = RMSNorm(d.state_size, eps=eps)

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[StateSpec]:
        d = self.dims
        return [
            StateSpec("conv", (d.conv_kernel - 1, d.intermediate), conv_dtype),
            StateSpec("ssm", (d.intermediate, d.state_size), ssm_dtype),
        ]

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        x, gate = self.in_proj(hidden).chunk(2, dim=-1)
        recurrence = lambda inputs, rows, lens: self._recurrence(fb, inputs, rows, lens)
        y = run_state_layer(fb, self.state_layer_id, [x.contiguous()], recurrence)
        return self.out_proj((y * F.silu(gate.float())).to(hidden.dtype))

    def _recurrence(
        self, fb: ForwardBatch, inputs: list[torch.Tensor], rows: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        """-> y + D * x, float32 [n, intermediate] (before the gate)."""
        d = self.dims
        state = fb.state_pool.layer(self.state_layer_id)
        kernels = fb.linear_attn_backend
        weight = self.conv1d.weight.view(d.intermediate, d.conv_kernel)
        x = kernels.causal_conv1d(
            inputs[0], weight, self.conv1d.bias, state["conv"], rows, lens, "silu"
        )
        dt, b, c = self.x_proj(x).split([d.dt_rank, d.state_size, d.state_size], dim=-1)
        if d.bcdt_rms_weights:
            dt, b, c = (t.contiguous() for t in (dt, b, c))
            dt, b, c = self.dt_layernorm(dt), self.b_layernorm(b), self.c_layernorm(c)
        elif d.bcdt_rms_eps is not None:
            dt, b, c = (_rms(t, d.bcdt_rms_eps) for t in (dt, b, c))
        dt = F.softplus(self.dt_proj(dt).float())
        a = -self.A_log.float().exp()
        y = kernels.selective_scan(x, dt, a, b, c, state["ssm"], rows, lens).float()
        return y + self.D.float() * x.float()
