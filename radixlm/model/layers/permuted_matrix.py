"""A weight stored with its input columns permuted (GPTQ act-order, quant/awq_gptq_repack.py): the
quantization groups of such a checkpoint are scattered over the input, so the loader sorts the
columns by group to make each 32-value block one group's, and the activation is gathered the same
way before the product: x @ W.T = x[:, perm] @ W[:, perm].T (as vLLM's act-order kernels do).

Not a QuantizedMatrix: the fused decoder op (layers/fused_layers.py) sees an unknown matrix and
leaves such a model on the Python layers, which apply the gather.
"""

from __future__ import annotations

import torch

from radixlm.model.layers.quantized import WeightMatrix


class PermutedInputMatrix(WeightMatrix):
    """out = x @ W.T where `inner` holds W[:, perm]."""

    def __init__(self, inner: WeightMatrix, perm: torch.Tensor):
        if perm.shape != (inner.cols,):
            raise ValueError(f"a permutation of {inner.cols} columns, got {tuple(perm.shape)}")
        self.inner, self.perm = inner, perm.to(torch.int64)
        self.rows, self.cols = inner.rows, inner.cols

    @property
    def formats(self) -> list[str]:
        return self.inner.formats

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes + self.perm.nbytes

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner.matmul(x.index_select(-1, self.perm), bias)

    def dequantize(self) -> torch.Tensor:
        return self.inner.dequantize()[:, torch.argsort(self.perm)]
