"""Which part of a checkpoint tensor a tensor-parallel rank holds (the loaders read only that part).

A TensorSlice names ranges of one dimension of the full (HF-layout) tensor; several ranges are
concatenated (a fused checkpoint tensor such as Phi-3's qkv_proj: this rank's q rows, then its k
rows, then its v rows). Parallel layers (layers/parallel_linear.py) say which slice each of their
parameters takes; the model maps checkpoint names to them (LlamaForCausalLM.tp_slice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSlice:
    dim: int  # 0: rows (column-parallel layers, vocabulary), 1: columns (row-parallel layers)
    ranges: tuple[
        tuple[int, int], ...
    ]  # (start, size) on dim of the full tensor, concatenated in order

    @property
    def size(self) -> int:
        return sum(n for _, n in self.ranges)

    @staticmethod
    def of(dim: int, start: int, size: int) -> TensorSlice:
        return TensorSlice(dim, ((start, size),))


# checkpoint (HF) name -> the slice this rank reads, or None: the whole tensor
Slicer = Callable[[str], TensorSlice | None]


def divide(total: int, parts: int, what: str) -> int:
    """total / parts, or a start-up error naming both numbers."""
    if total % parts:
        raise ValueError(f"{what} {total} is not divisible by tp_size {parts}")
    return total // parts


def slice_tensor(t, s: TensorSlice):
    """The slice of a torch tensor or numpy array (a view when there is one range)."""
    parts = [t[a : a + n] if s.dim == 0 else t[:, a : a + n] for a, n in s.ranges]
    if len(parts) == 1:
        return parts[0]
    import numpy as np
    import torch

    return (
        torch.cat(parts, s.dim)
        if isinstance(parts[0], torch.Tensor)
        else np.concatenate(parts, s.dim)
    )
