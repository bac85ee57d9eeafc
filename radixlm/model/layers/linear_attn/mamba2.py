"""The Mamba-2 mixer (Nemotron-H; the same block as Granite-4.0-H's and Falcon-H1's): in_proj gives
the gate z, the conv channels xBC and one dt per head; a causal conv (silu) over xBC with its conv
state; x, B, C split from it; the SSD recurrence per head (kernels.ssd) plus the D skip; the gated
RMSNorm over groups of the intermediate; out_proj.

Module and parameter names follow HF's NemotronHMamba2Mixer (in_proj, conv1d, dt_bias, A_log, D,
norm, out_proj). The state: conv [K - 1, intermediate + 2 * n_groups * state_size] and ssm
[heads, head_dim, state_size].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.segments import run_state_layer
from radixlm.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear


@dataclass(frozen=True)
class Mamba2Names:
    """The config fields a family names a Mamba-2 mixer's sizes by."""

    num_heads: str
    head_dim: str
    n_groups: str
    state_size: str
    conv_kernel: str
    conv_bias: str
    proj_bias: str  # absent means no bias
    eps: str
    act: str = "hidden_act"  # the conv's activation (Nemotron-H names its own)
    dt_min_only: bool = False  # dt clamped below at time_step_min only (Nemotron-H's mixer)


MAMBA2_NAMES = Mamba2Names(  # HF Mamba2Config
    "num_heads", "head_dim", "n_groups", "state_size", "conv_kernel", "use_conv_bias", "use_bias",
    "layer_norm_epsilon",
)  # fmt: skip
HYBRID_NAMES = Mamba2Names(  # Granite-4.0-H, Bamba, Falcon-H1
    "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv",
    "mamba_conv_bias", "mamba_proj_bias", "rms_norm_eps",
)  # fmt: skip
NEMOTRON_H_NAMES = Mamba2Names(
    "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel",
    "use_conv_bias", "use_bias", "layer_norm_epsilon", act="mamba_hidden_act", dt_min_only=True,
)  # fmt: skip


@dataclass(frozen=True)
class Mamba2Dims:
    """A Mamba-2 mixer's sizes and switches (each family names them in its config)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool
    eps: float
    # dt is clamped to this range after the softplus (HF's time_step_limit as the mixer sets it)
    dt_limit: tuple[float, float] = (0.0, float("inf"))

    @classmethod
    def from_config(cls, config: Any, names: Mamba2Names, family: str) -> Mamba2Dims:
        """The dims as a family's config names them (MAMBA2_NAMES, HYBRID_NAMES, NEMOTRON_H_NAMES);
        the conv's activation, which radixlm runs as silu only."""
        act = getattr(config, names.act, "silu")
        if act != "silu":
            raise ValueError(f"{family} {names.act} {act!r}: radixlm runs silu")
        if names.dt_min_only:  # NemotronHMamba2Mixer's own limit, whatever time_step_limit says
            limit = (config.time_step_min, float("inf"))
        else:
            limit = tuple(config.time_step_limit or (0.0, float("inf")))
        get = lambda field: getattr(config, getattr(names, field))
        return cls(
            hidden_size=config.hidden_size,
            num_heads=get("num_heads"),
            head_dim=get("head_dim"),
            n_groups=get("n_groups"),
            state_size=get("state_size"),
            conv_kernel=get("conv_kernel"),
            conv_bias=bool(get("conv_bias")),
            proj_bias=bool(getattr(config, names.proj_bias, False)),
            eps=get("eps"),
            dt_limit=(float(limit[0]), float(limit[1])),
        )

    @classmethod
    def from_mamba_config(cls, config: Any, family: str) -> Mamba2Dims:
        """The dims as Granite-4.0-H's, Bamba's and Falcon-H1's configs name them."""
        return cls.from_config(config, HYBRID_NAMES, family)

    @property
    def intermediate(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate + 2 * self.n_groups * self.state_size


class GroupedGatedRMSNorm(nn.Module):
    """x * silu(z), then RMSNorm over each group of `group_size` channels, times w, in float32
    (HF's NemotronHRMSNormGated: the gate applied before the norm, each group normed alone)."""

    def __init__(self, dim: int, group_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size, self.eps = group_size, eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """-> float32 [n, dim] (the caller casts: HF's norm sees the scan's float32 output)."""
        n = x.shape[0]
        x32 = (x.float() * F.silu(z.float())).reshape(n, -1, self.group_size)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.float() * x32.reshape(n, -1)


class Mamba2Mixer(nn.Module):
    def __init__(self, dims: Mamba2Dims, state_layer_id: int):
        super().__init__()
        if dims.num_heads % dims.n_groups:
            raise ValueError(
                f"Mamba-2: {dims.num_heads} heads are not a multiple of n_groups {dims.n_groups}"
            )
        self.dims = d = dims
        self.state_layer_id = state_layer_id
        self.in_proj = ColumnParallelLinear(
            d.hidden_size, d.intermediate + d.conv_dim + d.num_heads, bias=d.proj_bias
        )
        self.conv1d = nn.Conv1d(
            d.conv_dim, d.conv_dim, d.conv_kernel, groups=d.conv_dim, bias=d.conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(d.num_heads))
        self.A_log = nn.Parameter(torch.zeros(d.num_heads))
        self.D = nn.Parameter(torch.ones(d.num_heads))
        self.norm = GroupedGatedRMSNorm(d.intermediate, d.intermediate // d.n_groups, d.eps)
        self.out_proj = RowParallelLinear(
            d.intermediate, d.hidden_size, bias=d.proj_bias, what="Mamba-2 heads"
        )

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[StateSpec]:
        d = self.dims
        return [
            StateSpec("conv", (d.conv_kernel - 1, d.conv_dim), conv_dtype),
            StateSpec("ssm", (d.num_heads, d.head_dim, d.state_size), ssm_dtype),
        ]

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """-> [gate z | conv channels xBC | dt] (Falcon-H1 scales its input and each part)."""
        return self.in_proj(hidden)

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        d = self.dims
        gate, xbc, dt = self.project(hidden).split(
            [d.intermediate, d.conv_dim, d.num_heads], dim=-1
        )
        # HF's chunked (prompt) path clamps dt; its one-token path does not: clamped here always,
        # so a decode step equals a prompt's token (they differ only where dt < time_step_min).
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*d.dt_limit)
        recurrence = lambda inputs, rows, lens: self._recurrence(fb, inputs, rows, lens)
        y = run_state_layer(fb, self.state_layer_id, [xbc, dt], recurrence)
        return self.out_proj(self.norm(y, gate).to(hidden.dtype))

    def _recurrence(
        self, fb: ForwardBatch, inputs: list[torch.Tensor], rows: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        """-> y + D * x, float32 [n, intermediate]."""
        d = self.dims
        xbc, dt = inputs
        n = xbc.shape[0]
        state = fb.state_pool.layer(self.state_layer_id)
        kernels = fb.linear_attn_backend
        weight = self.conv1d.weight.view(d.conv_dim, d.conv_kernel)
        xbc = kernels.causal_conv1d(
            xbc, weight, self.conv1d.bias, state["conv"], rows, lens, "silu"
        )
        gn = d.n_groups * d.state_size
        x, b, c = xbc.split([d.intermediate, gn, gn], dim=-1)
        x = x.reshape(n, d.num_heads, d.head_dim)
        b = b.reshape(n, d.n_groups, d.state_size)
        c = c.reshape(n, d.n_groups, d.state_size)
        a = -self.A_log.float().exp()
        y = kernels.ssd(x, dt, a, b, c, state["ssm"], rows, lens).float()
        y = y + self.D.float()[:, None] * x.float()
        return y.reshape(n, d.intermediate)
