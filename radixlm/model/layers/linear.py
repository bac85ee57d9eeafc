"""Plain (single-device) linear layers, with fused projections as in SGLang.

A fused layer holds several HF projections stacked along the output dim
(q/k/v -> qkv_proj, gate/up -> gate_up_proj): one matmul instead of three.
`load_shard` copies one HF tensor into its slice; the loader calls it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# MKL's fp32 GEMM (CPU) is pathologically slow for 9..15 rows: 12 rows take up to ~1.9x the
# time of 16 in isolation, and a 12-request decode step ~8% longer (docs/benchmarks.md).
# Padding such inputs to 16 rows costs a copy of a few KiB.
_PAD_ROWS = range(9, 16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    m = x.shape[0]
    if m in _PAD_ROWS and x.dim() == 2 and x.device.type == "cpu" and x.dtype == torch.float32:
        padded = x.new_zeros(16, x.shape[1])
        padded[:m] = x
        return F.linear(padded, weight, bias)[:m]
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # Uninitialized: every weight is overwritten by load_weights.
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked on the output dim."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)
        self.offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: int) -> None:
        start, size = self.offsets[shard], self.output_sizes[shard]
        if loaded.shape[0] != size:
            raise ValueError(f"shard {shard}: expected {size} rows, got {tuple(loaded.shape)}")
        with torch.no_grad():
            param[start : start + size].copy_(loaded)


class VocabEmbedding(nn.Module):
    """Token embedding; its weight doubles as the lm_head when embeddings are tied."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        # Uninitialized (nn.Embedding would spend ~0.3 s drawing random numbers).
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)
