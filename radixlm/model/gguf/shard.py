"""Reading one GGUF tensor, or only a tensor-parallel rank's part of it, from the mapped file.

Rows (column-parallel layers, the vocabulary) are cut anywhere: each row's blocks stand alone.
Columns (row-parallel layers) are cut on whole quantization blocks, reading only those bytes of
each row; a cut inside a block (a 256-value K-quant block across the rank boundary) dequantizes
the blocks it touches and requantizes the rank's columns to Q8_0 (or keeps them float32 where even
32 does not divide them), with a warning naming the tensor, once per process and kind.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from radixlm.model.tp_shard import TensorSlice, slice_tensor

logger = logging.getLogger(__name__)
REQUANT_FORMAT = "q8_0"
_warned: set[str] = set()


def _bytes_view(t) -> np.ndarray:
    """The tensor as stored: uint8 [rows, row_bytes] for a matrix (any type), else its 1-D
    values."""
    data = t.data
    return data.view(np.uint8) if data.ndim == 2 else data


def _column_bytes(raw: np.ndarray, qtype, s: TensorSlice) -> tuple[np.ndarray | None, list]:
    """The bytes of the slice's columns when every range falls on whole blocks, else None and the
    misaligned ranges."""
    from gguf.constants import GGML_QUANT_SIZES

    block, block_bytes = GGML_QUANT_SIZES[qtype]
    bad = [(a, n) for a, n in s.ranges if a % block or n % block]
    if bad:
        return None, bad
    parts = [raw[:, a // block * block_bytes : (a + n) // block * block_bytes] for a, n in s.ranges]
    return (parts[0] if len(parts) == 1 else np.concatenate(parts, 1)), []


def _dequantized_columns(raw: np.ndarray, qtype, s: TensorSlice) -> np.ndarray:
    """float32 [rows, slice size]: the blocks covering each range, dequantized, then cut."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    block, block_bytes = GGML_QUANT_SIZES[qtype]
    parts = []
    for a, n in s.ranges:
        b0, b1 = a // block, -(-(a + n) // block)
        span = np.ascontiguousarray(raw[:, b0 * block_bytes : b1 * block_bytes])
        parts.append(
            dequantize(span, qtype).reshape(raw.shape[0], -1)[
                :, a - b0 * block : a - b0 * block + n
            ]
        )
    return np.concatenate(parts, 1) if len(parts) > 1 else parts[0]


def read_tensor(t, fmt, s: TensorSlice | None, name: str) -> Any:
    """t (a gguf ReaderTensor) as the loader hands it on: a QuantizedTensor where fmt (its kernel
    format) is given, else float32; only the slice s of it when given."""
    from radixlm.model.layers.quantized import QuantizedTensor

    raw, qtype = _bytes_view(t), t.tensor_type
    if s is not None and s.dim == 0:
        raw = slice_tensor(raw, s)
    elif s is not None:
        cut, bad = _column_bytes(raw, qtype, s)
        if cut is None:
            w = torch.from_numpy(np.ascontiguousarray(_dequantized_columns(raw, qtype, s)))
            if fmt is None:
                return w
            return _requantized(w, name, fmt.name, bad)
        raw = cut
    if fmt is not None:
        w = torch.from_numpy(np.array(raw))
        return QuantizedTensor(w.contiguous(), fmt, w.shape[1] // fmt.block_bytes * fmt.block)
    from gguf.quants import dequantize

    out = dequantize(np.ascontiguousarray(raw), qtype)
    if raw.ndim == 2:
        out = out.reshape(raw.shape[0], -1)
    return torch.from_numpy(out if out.flags.writeable else out.copy()).float()


def _requantized(w: torch.Tensor, name: str, fmt_name: str, bad: list) -> Any:
    from radixlm.kernels.formats import FORMATS
    from radixlm.model.layers.quantized import QuantizedTensor

    target = FORMATS[REQUANT_FORMAT]
    kind = f"{fmt_name}->{REQUANT_FORMAT if target.supports(w.shape[1]) else 'f32'}"
    if kind not in _warned:
        _warned.add(kind)
        logger.warning(
            "tensor parallelism: %s (%s) splits inside its %s blocks at columns %s: this rank's %d"
            " columns are requantized to %s (same for every such tensor)",
            name,
            fmt_name,
            fmt_name,
            [a for a, _ in bad],
            w.shape[1],
            kind.split("->")[1],
        )
    if not target.supports(w.shape[1]):
        return w
    return QuantizedTensor.quantize(w, REQUANT_FORMAT)


def cut(w, s: TensorSlice | None, name: str):
    """This rank's slice of a tensor read whole (transformed, or joined from two)."""
    from radixlm.model.layers.quantized import QuantizedTensor

    if s is None:
        return w
    if not isinstance(w, QuantizedTensor):
        return slice_tensor(w, s).contiguous()
    if s.dim == 0:
        return QuantizedTensor(slice_tensor(w.data, s).contiguous(), w.fmt, w.cols)
    block, nbytes = w.fmt.block, w.fmt.block_bytes
    if any(a % block or n % block for a, n in s.ranges):
        raise ValueError(
            f"{name}: a tensor-parallel cut at columns {s.ranges} splits its"
            f" {w.fmt.name.upper()} blocks"
        )
    cuts = [w.data[:, a // block * nbytes : (a + n) // block * nbytes] for a, n in s.ranges]
    return QuantizedTensor(torch.cat(cuts, 1).contiguous(), w.fmt, s.size)
