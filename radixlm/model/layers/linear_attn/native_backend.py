"""The recurrences as native CPU kernels (kernels/csrc/recurrent.cpp, gated_delta.cpp,
gdn_fused.cpp and kda.cpp: torch.ops.radixlm).

One op per call for the whole batch, decode and extend alike: the kernels work per (request,
head, block of the state), so a decode step streams each state once and an extend runs token by
token with the state block in L1. They compute in float32 from float32 inputs (anything else is
converted here) and read and write float32, bfloat16 or float16 states in place.
"""

from __future__ import annotations

import torch

from radixlm.kernels.ops import ops
from radixlm.model.layers.linear_attn.base import LinearAttnBackend


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()


class NativeLinearAttnBackend(LinearAttnBackend):
    name = "native"

    def __init__(self) -> None:
        self._ops = ops()

    def causal_conv1d(self, x, weight, bias, conv_state, rows, seq_lens, activation):
        if activation not in (None, "silu"):
            raise ValueError(f"causal_conv1d: activation {activation!r} (silu or None)")
        y = self._ops.causal_conv1d(
            _f32(x),
            _f32(weight),
            None if bias is None else _f32(bias),
            conv_state,
            rows,
            list(seq_lens),
            activation == "silu",
        )
        return y.to(x.dtype)

    def gated_delta_rule(self, q, k, v, g, beta, ssm_state, rows, seq_lens):
        o = self._ops.gated_delta_rule(
            _f32(q), _f32(k), _f32(v), _f32(g), _f32(beta), ssm_state, rows, list(seq_lens)
        )
        return o.to(v.dtype)

    def gated_delta_rule_gated(
        self, q, k, v, a, b, a_log, dt_bias, ssm_state, rows, seq_lens, tiled
    ):
        o = self._ops.gated_delta_rule_gated(
            _f32(q),
            _f32(k),
            _f32(v),
            _f32(a),
            _f32(b),
            _f32(a_log).contiguous(),
            _f32(dt_bias).contiguous(),
            ssm_state,
            rows,
            list(seq_lens),
            bool(tiled),
        )
        return o.to(v.dtype)

    def kimi_delta_rule(self, q, k, v, g, beta, ssm_state, rows, seq_lens):
        o = self._ops.kimi_delta_rule(
            _f32(q), _f32(k), _f32(v), _f32(g), _f32(beta), ssm_state, rows, list(seq_lens)
        )
        return o.to(v.dtype)

    def gated_rmsnorm(self, x, z, weight, eps):
        fused = x.dim() in (2, 3) and x.stride(-1) == 1 and z.stride(-1) == 1
        if x.dtype != torch.float32 or z.dtype != torch.float32 or not fused:
            return super().gated_rmsnorm(x, z, weight, eps)  # the torch default (HF's casts)
        return self._ops.gated_rmsnorm(x, z, _f32(weight).contiguous(), float(eps))

    def ssd(self, x, dt, a, b, c, ssm_state, rows, seq_lens):
        y = self._ops.ssd_update(
            _f32(x), _f32(dt), _f32(a), _f32(b), _f32(c), ssm_state, rows, list(seq_lens)
        )
        return y.to(x.dtype)
