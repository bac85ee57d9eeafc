"""Plain (single-device) linear layers, with fused projections as in SGLang.

A fused layer holds several HF projections stacked along the output dim
(q/k/v -> qkv_proj, gate/up -> gate_up_proj): one matmul instead of three.
`load_shard` copies one HF tensor into its slice; the loader calls it.
A weight held in another form replaces the float parameter (`weight` becomes None, `qweight`
multiplies): the native CPU kernels' blocks the loader hands over (layers/quantized.py) or what a
--quantization method makes of the loaded weight (model/quant/methods.py: FP8's is
layers/fp8_linear.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor, WeightMatrix

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
        self.qweight: WeightMatrix | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            return self.qweight.matmul(x, self.bias)
        return linear(x, self.weight, self.bias)

    def set_quantized(self, parts: list) -> None:
        """Multiply by these row blocks (QuantizedTensor or float) from now on; drops the float
        weight."""
        self.set_matrix(QuantizedMatrix(parts))

    def set_matrix(self, matrix: WeightMatrix) -> None:
        """Multiply by `matrix` from now on; drops the float weight."""
        self.qweight = matrix
        self.weight = None

    def finish_loading(self) -> None:
        """Called once every tensor is in (MergedLinear assembles quantized shards here)."""


class MergedLinear(Linear):
    """Several projections of the same input stacked on the output dim."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)
        self.offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        self._quantized_shards: dict[int, QuantizedTensor] = {}

    def load_shard(self, param: nn.Parameter, loaded, shard: int) -> None:
        start, size = self.offsets[shard], self.output_sizes[shard]
        if tuple(loaded.shape) != (size, *param.shape[1:]):
            raise ValueError(
                f"shard {shard}: expected {(size, *param.shape[1:])}, got {tuple(loaded.shape)}"
            )
        if isinstance(loaded, QuantizedTensor):
            self._quantized_shards[shard] = loaded
            return
        with torch.no_grad():
            param[start : start + size].copy_(loaded)

    def finish_loading(self) -> None:
        if self._quantized_shards:
            parts = [self._quantized_shards.get(i) for i in range(len(self.output_sizes))]
            self.set_quantized(
                [
                    p if p is not None else self.weight[o : o + n].detach().clone()
                    for p, o, n in zip(parts, self.offsets, self.output_sizes)
                ]
            )
            self._quantized_shards = {}


def split_rows(tensor, sizes: list[int]) -> list:
    """A fused checkpoint tensor (Phi-3's qkv_proj, gate_up_proj) cut into its shards' rows, for
    MergedLinear.load_shard. Quantized blocks are cut too: each row's blocks stand alone."""
    if not isinstance(tensor, QuantizedTensor):
        return list(tensor.split(sizes, dim=0))
    if tensor.shape[0] != sum(sizes) or any(n % tensor.fmt.group for n in sizes):
        raise ValueError(
            f"cannot cut {tensor.shape[0]} quantized rows (groups of {tensor.fmt.group}) into"
            f" {sizes}"
        )
    starts = [sum(sizes[:i]) // tensor.fmt.group for i in range(len(sizes) + 1)]
    return [
        QuantizedTensor(tensor.data[a:b], tensor.fmt, tensor.cols)
        for a, b in zip(starts, starts[1:])
    ]


class VocabEmbedding(nn.Module):
    """Token embedding; its weight doubles as the lm_head when embeddings are tied."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        # Uninitialized (nn.Embedding would spend ~0.3 s drawing random numbers).
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.qweight: QuantizedMatrix | None = None  # the native formats only (FP8: left float)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            return self.qweight.embedding(input_ids)
        return F.embedding(input_ids, self.weight)

    def set_quantized(self, parts: list) -> None:
        self.qweight = QuantizedMatrix(parts)
        self.weight = None

    def finish_loading(self) -> None:
        pass

    def as_lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden @ weight.T: the tied output projection."""
        if self.qweight is not None:
            return self.qweight.matmul(hidden)
        return linear(hidden, self.weight)


def quantize_module_weights(model: nn.Module, fmt_name: str) -> list[str]:
    """Quantize every linear layer's and the embedding's float weight to `fmt_name` in place
    (--quantization); layers whose input size the format cannot block stay float (returned)."""
    from radixlm.kernels.formats import FORMATS

    fmt, skipped = FORMATS[fmt_name], []
    for name, module in model.named_modules():
        if isinstance(module, (Linear, VocabEmbedding)) and module.qweight is None:
            if fmt.supports(module.weight.shape[1]):
                module.set_quantized([QuantizedTensor.quantize(module.weight.detach(), fmt_name)])
            else:
                skipped.append(name)
    return skipped
