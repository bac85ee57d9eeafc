"""What the loaded weights hold in memory, and the process's resident memory (reported at load).

Loading makes large short-lived copies (a tensor read from the file, stacked shards, the repacked
layout): with glibc's default the threshold for serving large allocations by mmap grows after the
first frees, so later copies come from the heap and stay resident after they are freed. A fixed
threshold hands every large block back to the OS when it is freed. For the load only: a CPU
ModelRunner sets the serving policy after it (utils.keep_freed_memory_in_heap), or every forward
would fault its activations' pages afresh.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch
from torch import nn

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_frees_to_os() -> bool:
    """Fix glibc's mmap threshold at 1 MiB (no-op elsewhere); True if it took effect."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError, TypeError):
        return False


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights: parameters and quantized matrices, each storage once (buffers,
    such as RoPE's cos/sin tables, are derived and left out)."""
    from radixlm.model.layers.quantized import WeightMatrix

    seen: set[int] = set()
    total = 0
    for t in model.parameters():
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    for m in model.modules():
        # (nn.Module's own dicts are underscored: _parameters, _buffers, _modules, hooks)
        attrs = [v for k, v in vars(m).items() if not (k.startswith("_") and isinstance(v, dict))]
        for v in _held(attrs):
            if isinstance(v, WeightMatrix) and id(v) not in seen:
                seen.add(id(v))
                total += v.nbytes
            elif isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                total += v.untyped_storage().nbytes()
    return total


def weight_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors holding the model's weights, each storage once: parameters, the quantized
    matrices' blocks (float segments too) and stacked experts held outside parameters."""
    from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor

    seen: set[int] = set()
    out = []

    def add(t: torch.Tensor) -> None:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            out.append(t)

    for t in model.parameters():
        add(t)
    for m in model.modules():
        attrs = [v for k, v in vars(m).items() if not (k.startswith("_") and isinstance(v, dict))]
        for v in _held(attrs):
            if isinstance(v, torch.Tensor):
                add(v)
            elif isinstance(v, QuantizedMatrix):
                for seg in v.segments:
                    w = seg.weight
                    add(w.data if isinstance(w, QuantizedTensor) else w)
    return out


def _held(values, in_dict: bool = False):
    """Quantized matrices and stacked experts' blocks a module holds outside its parameters, as
    attributes or in dicts of weights (gpt-oss's experts: `quantized`, `fused` with its biases)."""
    from radixlm.model.layers.moe.experts import ExpertWeights
    from radixlm.model.layers.quantized import WeightMatrix

    for v in values:
        if isinstance(v, dict):
            yield from _held(v.values(), in_dict=True)
        elif isinstance(v, ExpertWeights):
            yield v.data
        elif isinstance(v, WeightMatrix) or (in_dict and isinstance(v, torch.Tensor)):
            yield v


def resident_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
