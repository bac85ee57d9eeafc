"""All experts' copy of one projection, stacked: what the loader hands the fused MoE layer.

Quantized, the blocks stay as a GGUF 3-D tensor stores them (expert after expert), so
data[e] is expert e's matrix in the layout `QuantizedTensor` uses and the native kernels read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.kernels.formats import INTERLEAVED, QuantFormat
from radixlm.model.layers.quantized import QuantizedTensor


@dataclass
class ExpertWeights:
    """out_e = x @ W_e.T with W_e [rows, cols] for every expert e.

    data: uint8 [E, rows / fmt.group, fmt.row_bytes(cols)] when quantized (fmt set), else a float
    tensor [E, rows, cols] (fmt None)."""

    data: torch.Tensor
    fmt: QuantFormat | None
    rows: int
    cols: int

    @property
    def num_experts(self) -> int:
        return self.data.shape[0]

    @property
    def quantized(self) -> bool:
        return self.fmt is not None

    def expert(self, e: int) -> QuantizedTensor | torch.Tensor:
        return (
            QuantizedTensor(self.data[e], self.fmt, self.cols) if self.quantized else self.data[e]
        )

    def interleaved(self, parts: int = 1) -> ExpertWeights:
        """Each expert in the kernels' 8-row interleaved layout where its format has one (same
        values, 2-2.7x the row-major kernels), else self. parts: row ranges that must not share a
        group of 8 (w13 = [gate; up] passes 2: the fused op runs the halves as separate slices)."""
        fmt = INTERLEAVED.get(self.fmt.name) if self.quantized else None
        if fmt is None or self.rows % parts or (self.rows // parts) % fmt.group:
            return self
        from radixlm.kernels.ops import ops

        data = torch.stack(
            [
                ops().repack_x8(self.data[e].contiguous(), self.fmt.kernel_id, self.cols)
                for e in range(self.num_experts)
            ]
        )
        return ExpertWeights(data, fmt, self.rows, self.cols)

    def dequantize(self) -> torch.Tensor:
        """float32 [E, rows, cols]."""
        if not self.quantized:
            return self.data.float()
        return torch.stack([self.expert(e).dequantize() for e in range(self.num_experts)])

    @staticmethod
    def from_float(w: torch.Tensor, fmt_name: str | None = None) -> ExpertWeights:
        """Stack [E, rows, cols] float weights, quantized to fmt_name when given (tests,
        --quantization)."""
        E, rows, cols = w.shape
        if fmt_name is None:
            return ExpertWeights(w.contiguous(), None, rows, cols)
        parts = [QuantizedTensor.quantize(w[e].float(), fmt_name) for e in range(E)]
        return ExpertWeights(torch.stack([p.data for p in parts]), parts[0].fmt, rows, cols)
