"""FP8 weights (--quantization fp8): a linear layer's weight as float8_e4m3fn with float32 scales,
multiplied by the Triton W8A16 GEMM (kernels/triton_ops/fp8_gemm.py); activations keep the model
dtype.

Quantized online at load, as vLLM's and SGLang's `fp8` does for a 16-bit checkpoint: each output
row (or each 128 x 128 block, `block=128`) is scaled so its largest magnitude is e4m3's largest
finite value (448), then rounded to nearest even. The dequantized weight is q * scale; the error
of each value is at most half e4m3's spacing there (2^-4 of the value for normal values, 2^-10 of
the scale below e4m3's smallest normal, 2^-6).
"""

from __future__ import annotations

import torch

from radixlm.model.layers.quantized import WeightMatrix

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def _tiles(n: int, b: int) -> int:
    return -(-n // b)


def quantize_fp8(w: torch.Tensor, block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (any float dtype, any device) -> (q [N, K] float8_e4m3fn, scale float32): scale
    [N] (block 0: per output channel) or [cdiv(N, block), cdiv(K, block)]. An all-zero row or block
    gets scale 1 (its values are 0 either way)."""
    w = w.detach().float()
    n, k = w.shape
    if block:
        tn, tk = _tiles(n, block), _tiles(k, block)
        padded = w.new_zeros(tn * block, tk * block)
        padded[:n, :k] = w
        amax = padded.view(tn, block, tk, block).abs().amax(dim=(1, 3))
    else:
        amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / expand_scale(scale, n, k, block)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.contiguous(), scale.contiguous()


def expand_scale(scale: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    """Each weight value's scale, [N, K] (or [N, 1] per channel: broadcasts)."""
    if not block:
        return scale[:, None]
    return scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]


class Fp8Matrix(WeightMatrix):
    """out = x @ (q * scale)^T: the FP8 weight of one linear layer (fused ones: their stacked rows,
    each row's scale its own, so a fused layer is one matrix)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, block: int = 0):
        self.q, self.scale, self.block = q, scale, block
        self.rows, self.cols = q.shape

    @classmethod
    def quantize(cls, w: torch.Tensor, block: int = 0) -> Fp8Matrix:
        return cls(*quantize_fp8(w, block), block)

    @property
    def formats(self) -> list[str]:
        return [f"fp8_e4m3 ({f'{self.block}x{self.block} blocks' if self.block else 'per row'})"]

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from radixlm.kernels.triton_ops.fp8_gemm import fp8_linear

        lead = x.shape[:-1]
        out = fp8_linear(x.reshape(-1, self.cols), self.q, self.scale, self.block)
        if bias is not None:
            out += bias
        return out.view(*lead, self.rows)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by, [N, K]."""
        return self.q.float() * expand_scale(self.scale, self.rows, self.cols, self.block)
