"""The recurrences as Triton kernels (kernels/triton_ops/linear_attn.py): CUDA, and CPU tensors
under Triton's interpreter for tests.

One launch per call for the whole batch, decode and extend alike: a program walks one request's
tokens in order with its block of the state in registers (float32), so a decode step reads and
writes each state once.
"""

from __future__ import annotations

import itertools

import torch

from radixlm.model.layers.linear_attn.base import LinearAttnBackend


def _cu_seqlens(seq_lens: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int64, device=device)


def _rows(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    return rows.to(device=device, dtype=torch.int64)


class TritonLinearAttnBackend(LinearAttnBackend):
    name = "triton"

    def __init__(self) -> None:
        # Imported here: a kernel module is compiled or interpreted as it is imported, and only a
        # process that chose this backend should import triton.
        from radixlm.kernels.triton_ops import linear_attn

        self._k = linear_attn

    def causal_conv1d(self, x, weight, bias, conv_state, rows, seq_lens, activation):
        if activation not in (None, "silu"):
            raise ValueError(f"causal_conv1d: activation {activation!r} (silu or None)")
        return self._k.causal_conv1d(
            x,
            weight,
            bias,
            conv_state,
            _rows(rows, x.device),
            _cu_seqlens(seq_lens, x.device),
            max(seq_lens, default=0),
            activation == "silu",
        )

    def gated_delta_rule(self, q, k, v, g, beta, ssm_state, rows, seq_lens):
        return self._k.gated_delta_rule(
            q, k, v, g, beta, ssm_state, _rows(rows, v.device), _cu_seqlens(seq_lens, v.device)
        )

    def kimi_delta_rule(self, q, k, v, g, beta, ssm_state, rows, seq_lens):
        return self._k.kimi_delta_rule(
            q, k, v, g, beta, ssm_state, _rows(rows, v.device), _cu_seqlens(seq_lens, v.device)
        )

    def ssd(self, x, dt, a, b, c, ssm_state, rows, seq_lens):
        return self._k.ssd_update(
            x, dt, a, b, c, ssm_state, _rows(rows, x.device), _cu_seqlens(seq_lens, x.device)
        )
