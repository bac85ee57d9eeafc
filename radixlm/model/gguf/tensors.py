"""One GGUF tensor as the loader yields it, and the tensor transforms that several architecture
families share (llama.cpp's q / k permutation undone, the Mamba-2 state tensors back in HF's form).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from radixlm.model.gguf.shard import cut, read_tensor
from radixlm.model.tp_shard import TensorSlice

# A tensor's name: its layer (None at the top), base name (dots allowed: shortconv.conv), suffix
# (None for ssm_a and the like, which the converters write without one).
SSM_TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?([\w.]+?)(?:\.(weight|bias))?$")


def read_weight(t, name: str, s: TensorSlice | None, keep_quantized: bool) -> Any:
    """One tensor (only slice s of it when given) as loader.gguf_weights yields it: ExpertWeights
    for a 3-D experts tensor, a QuantizedTensor for a 2-D one in a kernel format when
    keep_quantized (ValueError for a 2-D type with no kernel other than F32), else float32."""
    from gguf import GGMLQuantizationType

    from radixlm.kernels.formats import GGUF_FORMATS, format_of_ggml

    if t.data.ndim == 3:
        return read_experts(t, keep_quantized, s, name)
    fmt = format_of_ggml(t.tensor_type) if keep_quantized and t.data.ndim == 2 else None
    if (
        keep_quantized
        and t.data.ndim == 2
        and fmt is None
        and t.tensor_type != GGMLQuantizationType.F32
    ):
        raise ValueError(
            f"{t.name} ({name}): GGUF type {t.tensor_type.name} has no native kernel in radixlm"
            f" (supported: {', '.join(f.upper() for f in GGUF_FORMATS)}, F32);"
            " --quantization none loads it dequantized to float32"
        )
    return read_tensor(t, fmt, s, name)


def read_experts(t, keep_quantized: bool, s: TensorSlice | None, name: str) -> Any:
    """A 3-D expert tensor [experts, rows, cols] (only the experts of slice s, dim 0): ExpertWeights
    with the blocks as stored when keep_quantized and the type has a kernel, else float32 [n, rows,
    cols].
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from radixlm.kernels.formats import GGUF_FORMATS, format_of_ggml
    from radixlm.model.layers.moe.experts import ExpertWeights

    if s is not None and s.dim != 0:
        raise ValueError(f"{t.name} ({name}): experts are split by expert, not by {s}")
    data = t.data
    raw = data.view(np.uint8) if data.dtype not in (np.float32, np.uint8) else data
    if s is not None:
        raw = (
            np.concatenate([raw[a : a + n] for a, n in s.ranges])
            if len(s.ranges) > 1
            else raw[s.ranges[0][0] :][: s.size]
        )
    cols = int(t.shape[0])  # ggml's ne[0]: the input size
    fmt = format_of_ggml(t.tensor_type) if keep_quantized else None
    if keep_quantized and fmt is None and t.tensor_type != GGMLQuantizationType.F32:
        raise ValueError(
            f"{t.name} ({name}): GGUF type {t.tensor_type.name} has no native kernel in radixlm "
            f"(supported: {', '.join(f.upper() for f in GGUF_FORMATS)}, F32); "
            "--quantization none loads it dequantized to float32"
        )
    if fmt is not None:
        return ExpertWeights(torch.from_numpy(np.array(raw)), fmt, raw.shape[1], cols)
    out = dequantize(np.ascontiguousarray(raw), t.tensor_type).reshape(
        raw.shape[0], raw.shape[1], cols
    )
    return torch.from_numpy(out if out.flags.writeable else out.copy()).float()


def unpermute(w, heads: int):
    """LlamaModel.permute undone over `heads` heads (each head's rows [2, D / 2] interleaved back to
    [D / 2, 2], HF's rotate-half order): a weight or a bias; a quantized matrix moves whole rows.
    A tensor-parallel rank's slice holds whole heads, and the permutation acts within each head, so
    a slice un-permutes alone."""
    from radixlm.model.layers.quantized import QuantizedTensor

    data = w.data if isinstance(w, QuantizedTensor) else w
    rows, rest = data.shape[0], data.shape[1:]
    data = data.reshape(heads, rows // heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(data.contiguous(), w.fmt, w.cols)
    return data.contiguous()


def ssm_tensor(t, base: str, suffix: str, name: str, s: TensorSlice | None) -> Any:
    """A recurrent layer's tensor as HF holds it (A_log from the file's -exp(A_log); D and the
    gated norm flat; a conv [C, K] as [C, 1, K]; float32 always), or None for any other tensor."""
    if base == "ssm_a":
        a = read_tensor(t, None, None, name).double().reshape(-1)
        if not bool((a < 0).all()):
            raise ValueError(f"{t.name} ({name}): ssm_a must be -exp(A_log) < 0")
        return cut(torch.log(-a).float(), s, name)
    if base in ("ssm_d", "ssm_norm"):  # [H, 1], [groups, intermediate / groups]
        return cut(read_tensor(t, None, None, name).reshape(-1), s, name)
    if base in ("ssm_conv1d", "shortconv.conv") and suffix == "weight":
        return cut(read_tensor(t, None, None, name), s, name).unsqueeze(1)
    return None
