"""All experts' copy of one projection, stacked: what the loader hands the fused MoE layer.

Quantized, the blocks stay as a GGUF 3-D tensor stores them (expert after expert), so
data[e] is expert e's matrix in the layout `QuantizedTensor` uses and the native kernels read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlm.kernels.formats import QuantFormat
from radixlm.model.layers.quantized import QuantizedTensor


@dataclass
class ExpertWeights:
    """out_e = x @ W_e.T with W_e [rows, cols] for every expert e.

    data: uint8 [E, rows / fmt.group, fmt.row_bytes(cols)] when quantized (fmt set), else a float
    tensor [E, rows, cols] (fmt None)."""

    data: torch.Tensor
    fmt: Optional[QuantFormat]
    rows: int
    cols: int

    @property
    def num_experts(self) -> int:
        return self.data.shape[0]

    @property
    def quantized(self) -> bool:
        return self.fmt is not None

    def expert(self, e: int) -> QuantizedTensor | torch.Tensor:
        return QuantizedTensor(self.data[e], self.fmt, self.cols) if self.quantized else self.data[e]

    def dequantize(self) -> torch.Tensor:
        """float32 [E, rows, cols]."""
        if not self.quantized:
            return self.data.float()
        return torch.stack([self.expert(e).dequantize() for e in range(self.num_experts)])

    @staticmethod
    def from_float(w: torch.Tensor, fmt_name: Optional[str] = None) -> "ExpertWeights":
        """Stack [E, rows, cols] float weights, quantized to fmt_name when given (tests, --quantization)."""
        E, rows, cols = w.shape
        if fmt_name is None:
            return ExpertWeights(w.contiguous(), None, rows, cols)
        parts = [QuantizedTensor.quantize(w[e].float(), fmt_name) for e in range(E)]
        return ExpertWeights(torch.stack([p.data for p in parts]), parts[0].fmt, rows, cols)
