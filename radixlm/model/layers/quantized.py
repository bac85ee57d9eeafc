"""Weights kept quantized: what the loader hands over and what the linear layers multiply by.

A GGUF tensor in a format the kernels read (radixlm/kernels/formats.py) stays as its raw blocks;
fused layers (qkv_proj, gate_up_proj) stack their shards' rows, which works because every row's
blocks stand alone. Shards in different formats (Q4_K_M files mix Q4_K and Q6_K) become segments
of one matrix, each multiplied by its own kernel into its columns of the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.kernels.formats import FORMATS, INTERLEAVED, QuantFormat
from radixlm.kernels.ops import ops


@dataclass
class QuantizedTensor:
    """A 2-D weight as quantized blocks: data uint8 [rows / fmt.group, fmt.row_bytes(cols)]."""

    data: torch.Tensor
    fmt: QuantFormat
    cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0] * self.fmt.group, self.cols)

    def interleaved(self) -> QuantizedTensor:
        """This weight in the kernels' 8-row interleaved layout where there is one (same values)."""
        fmt = INTERLEAVED.get(self.fmt.name)
        if fmt is None or self.data.shape[0] % fmt.group:
            return self
        return QuantizedTensor(
            ops().repack_x8(self.data, self.fmt.kernel_id, self.cols), fmt, self.cols
        )

    def dequantize(self) -> torch.Tensor:
        return ops().dequantize(self.data, self.fmt.kernel_id, self.cols)

    @staticmethod
    def quantize(w: torch.Tensor, fmt_name: str) -> QuantizedTensor:
        from radixlm.kernels.formats import quantize

        return QuantizedTensor(quantize(w, fmt_name), FORMATS[fmt_name], w.shape[1])


class WeightMatrix:
    """What a linear layer multiplies by in place of its float weight (Linear.qweight): out = x @
    W^T for W [rows, cols] held in some other form (QuantizedMatrix: the native CPU kernels' blocks;
    fp8_linear.Fp8Matrix: FP8 with scales, a Triton GEMM)."""

    rows: int
    cols: int

    @property
    def formats(self) -> list[str]:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: the weight as held, its scales included."""
        raise NotImplementedError

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [rows, cols] that matmul multiplies by."""
        raise NotImplementedError


@dataclass
class _Segment:
    start: int  # first output column
    rows: int
    weight: QuantizedTensor | torch.Tensor  # a float tensor: a shard left unquantized


class QuantizedMatrix(WeightMatrix):
    """out = x @ W.T for W given as row segments (usually one), each quantized or float."""

    def __init__(self, parts: list[QuantizedTensor | torch.Tensor]):
        merged: list[QuantizedTensor | torch.Tensor] = []
        for p in parts:  # stack consecutive shards of one format into one segment
            prev = merged[-1] if merged else None
            if (
                isinstance(p, QuantizedTensor)
                and isinstance(prev, QuantizedTensor)
                and prev.fmt == p.fmt
            ):
                merged[-1] = QuantizedTensor(
                    torch.cat([prev.data, p.data]).contiguous(), p.fmt, p.cols
                )
            elif (
                not isinstance(p, QuantizedTensor)
                and prev is not None
                and not isinstance(prev, QuantizedTensor)
            ):
                merged[-1] = torch.cat([prev, p])
            else:
                merged.append(p)
        merged = [p.interleaved() if isinstance(p, QuantizedTensor) else p for p in merged]
        self.segments, start = [], 0
        for p in merged:
            self.segments.append(_Segment(start, p.shape[0], p))
            start += p.shape[0]
        self.rows, self.cols = start, parts[0].shape[1]
        only = self.segments[0].weight if len(self.segments) == 1 else None
        # The common case, one quantized segment, goes straight to the op (bs-1 decode is ~200
        # calls).
        self._single = (
            (only.data, only.fmt.kernel_id) if isinstance(only, QuantizedTensor) else None
        )

    @property
    def formats(self) -> list[str]:
        return [
            s.weight.fmt.name if isinstance(s.weight, QuantizedTensor) else str(s.weight.dtype)
            for s in self.segments
        ]

    @property
    def nbytes(self) -> int:
        return sum(
            (s.weight.data if isinstance(s.weight, QuantizedTensor) else s.weight).nbytes
            for s in self.segments
        )

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.cols)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        # The native kernels at every batch size: each output row is computed by the same operations
        # whatever else is batched (bitwise), so chunking, decode vs prefill and neighbours never
        # change a token. (A dequantize + fp32 GEMM path for large batches would not be: the int8
        # activation grid turns its last-bit differences into different roundings downstream.)
        if self._single is not None:
            out = ops().qlinear(x2, self._single[0], self._single[1], bias)
        else:
            out = x2.new_empty(x2.shape[0], self.rows)
            for s in self.segments:
                view = out[:, s.start : s.start + s.rows]
                if isinstance(s.weight, QuantizedTensor):
                    ops().qlinear_out(x2, s.weight.data, s.weight.fmt.kernel_id, None, view)
                else:
                    view.copy_(F.linear(x2, s.weight.float()))
            if bias is not None:
                out += bias
        return out.view(*lead, self.rows).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        if len(self.segments) == 1 and self._single is not None:
            return self.segments[0].weight.dequantize()
        return torch.cat(
            [
                s.weight.dequantize() if isinstance(s.weight, QuantizedTensor) else s.weight.float()
                for s in self.segments
            ]
        )

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` as float32 (the token embedding of a quantized tied table)."""
        if self._single is None:
            return F.embedding(ids, self.dequantize())
        flat = ids.reshape(-1)
        return (
            ops()
            .dequantize_rows(self._single[0], self._single[1], self.cols, flat)
            .view(*ids.shape, self.cols)
        )
