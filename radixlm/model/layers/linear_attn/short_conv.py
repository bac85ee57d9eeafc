"""LFM2's short convolution: in_proj gives B, C and x (hidden each); B * x runs through a causal
depthwise conv with no activation, continuing from its conv state; C gates its output; out_proj.

Module and parameter names follow HF's Lfm2ShortConv (in_proj, conv, out_proj). The state: conv
[L_cache - 1, hidden] only (no recurrent matrix).
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.cache.state_pool import StateSpec
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.segments import run_state_layer
from radixlm.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear


class ShortConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int, bias: bool, state_layer_id: int):
        super().__init__()
        self.hidden_size, self.kernel_size = hidden_size, kernel_size
        self.state_layer_id = state_layer_id
        self.in_proj = ColumnParallelLinear(hidden_size, 3 * hidden_size, bias=bias)
        self.conv = nn.Conv1d(hidden_size, hidden_size, kernel_size, groups=hidden_size, bias=bias)
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias=bias, what="hidden_size")

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[StateSpec]:
        return [StateSpec("conv", (self.kernel_size - 1, self.hidden_size), conv_dtype)]

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        b, c, x = self.in_proj(hidden).chunk(3, dim=-1)
        recurrence = lambda inputs, rows, lens: self._recurrence(fb, inputs, rows, lens)
        y = run_state_layer(fb, self.state_layer_id, [b * x], recurrence)
        return self.out_proj(c * y)

    def _recurrence(
        self, fb: ForwardBatch, inputs: list[torch.Tensor], rows: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        state = fb.state_pool.layer(self.state_layer_id)
        weight = self.conv.weight.view(self.hidden_size, self.kernel_size)
        return fb.linear_attn_backend.causal_conv1d(
            inputs[0], weight, self.conv.bias, state["conv"], rows, lens, None
        )
