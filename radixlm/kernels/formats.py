"""Weight formats the kernels read: GGUF block formats, per-channel int8, and 16-bit floats.

A quantized matrix is a uint8 tensor [rows, row_bytes] holding each row's blocks exactly as a GGUF
file stores them (so a GGUF tensor is used as is, and `gguf.quants` is the reference), or, for
int8, a float32 scale followed by the row's int8 values. F16 and BF16 (GGUF's, block 1) are the
row's 16-bit values as stored; their kernels keep activations in fp32 where the block formats
round them to int8. The ids match csrc/common.h's Fmt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class QuantFormat:
    name: str  # as --quantization and GGUF name it (lower case)
    kernel_id: int
    block: int  # values per block
    block_bytes: int
    row_extra: int = 0  # bytes before a row's blocks (int8's scale)
    group: int = 1  # weight rows per stored row (8: rows interleaved for the kernels, made at load)

    def row_bytes(self, cols: int) -> int:
        """Bytes of one stored row (of `group` weight rows)."""
        return cols // self.block * self.block_bytes + self.row_extra

    def supports(self, cols: int) -> bool:
        return cols % self.block == 0

    @property
    def ggml_type(self):
        import gguf

        return getattr(gguf.GGMLQuantizationType, self.name.upper(), None)


FORMATS = {
    f.name: f
    for f in (
        QuantFormat("q8_0", 0, 32, 34),
        QuantFormat("q4_0", 1, 32, 18),
        QuantFormat("q4_1", 2, 32, 20),
        QuantFormat("q4_k", 3, 256, 144),
        QuantFormat("q6_k", 4, 256, 210),
        QuantFormat("int8", 5, 32, 32, row_extra=4),
        QuantFormat("q5_0", 8, 32, 22),
        QuantFormat("q5_1", 9, 32, 24),
        QuantFormat("iq4_nl", 10, 32, 18),
        QuantFormat("q5_k", 11, 256, 176),
        QuantFormat("q3_k", 12, 256, 110),
        QuantFormat("q2_k", 13, 256, 84),
        QuantFormat("iq4_xs", 14, 256, 136),
        QuantFormat("f16", 15, 1, 2),
        QuantFormat("bf16", 16, 1, 2),
        QuantFormat("mxfp4", 19, 32, 17),  # gpt-oss's experts (OCP MX FP4: e2m1, e8m0 per 32)
        # FP8 checkpoints' e4m3 weights: per 128 values a float32 scale (times 256: the kernel
        # widens a byte to a half of 2^-8 its value), then the 128 bytes as stored.
        QuantFormat("fp8_e4m3", 21, 128, 132),
    )
}
# Formats whose kernels take fp32 activations as they are (csrc/float16_gemm.cpp, with FP8); the
# others quantize each activation row to int8 per 32 values first (K_ACTIVATIONS: per 256).
FLOAT16 = ("f16", "bf16")
FLOAT_ACTIVATIONS = (*FLOAT16, "fp8_e4m3")
FP8_BLOCK = 128
# The formats a GGUF file stores (the rest are made at load: int8, fp8_e4m3).
GGUF_FORMATS = tuple(n for n in FORMATS if n not in ("int8", "fp8_e4m3"))
# The 8-row interleaved layouts (csrc/quant_x8.cpp) the loader repacks these formats into when a
# matrix has a multiple of 8 rows: one integer multiply-add then serves 8 rows (2-2.7x the row-major
# kernels, docs/benchmarks.md). Q4_0 / Q5_0 store no min: the kernels make it from d (-8 d, -16 d),
# so their interleaved blocks are the row-major blocks' own size (Q4_1's layout: 11% more bytes).
INTERLEAVED = {
    "q4_0": QuantFormat("q4_0x8", 23, 32, 144, group=8),
    "q4_1": QuantFormat("q4_1x8", 6, 32, 160, group=8),
    # Q4X8's nibbles plus a plane of fifth bits
    "q5_0": QuantFormat("q5_0x8", 24, 32, 176, group=8),
    "q5_1": QuantFormat("q5_1x8", 22, 32, 192, group=8),
    "q8_0": QuantFormat("q8_0x8", 7, 32, 272, group=8),
    "q4_k": QuantFormat("q4_kx8", 17, 256, 1184, group=8),  # scales unpacked to bytes: +2.8%
    "q6_k": QuantFormat("q6_kx8", 18, 256, 1680, group=8),
    "mxfp4": QuantFormat("mxfp4x8", 20, 32, 136, group=8),  # the row-major blocks' own size
}
# The interleaved K-quants' kernels take llama.cpp's Q8_K activations instead (csrc/qact.h:
# quantize_row_k, one scale per 256 values): a super-block's 8 sub-block dots add up in int32 and
# take one float step (docs/benchmarks.md, issue 88).
K_ACTIVATIONS = ("q4_kx8", "q6_kx8")
# What --quantization can make from float weights at load (f16 / bf16: keep 16-bit weights, on the
# native kernels).
QUANTIZE_AT_LOAD = ("int8", "q4_0", "q8_0", "q4_k", "f16", "bf16")


def format_of_ggml(ggml_type) -> QuantFormat | None:
    """The kernel format of a GGUF tensor type, None for types the kernels do not read."""
    return FORMATS.get(ggml_type.name.lower())


def quantize(w: torch.Tensor, name: str) -> torch.Tensor:
    """float [rows, cols] -> the format's uint8 [rows, row_bytes] (GGUF's own quantizers for the
    block formats, ours for Q4_K, which gguf lacks; symmetric per-row absmax for int8)."""
    fmt = FORMATS[name]
    if not fmt.supports(w.shape[1]):
        raise ValueError(f"{name} needs columns in multiples of {fmt.block}, got {w.shape[1]}")
    w = w.detach().float().cpu()
    if name == "fp8_e4m3":  # absmax per 128 values onto e4m3's +-448
        scale = w.reshape(w.shape[0], -1, FP8_BLOCK).abs().amax(-1) / 448.0
        scale = torch.where(scale > 0, scale, 1.0)
        q = (w.reshape(w.shape[0], -1, FP8_BLOCK) / scale[..., None]).to(torch.float8_e4m3fn)
        return fp8_rows(q.reshape(w.shape), scale)
    if name in FLOAT16:  # round to nearest even, as gguf's converters do
        return (
            w.to(torch.float16 if name == "f16" else torch.bfloat16).view(torch.uint8).contiguous()
        )
    if name == "int8":
        scale = w.abs().amax(dim=1, keepdim=True) / 127.0
        q = torch.where(scale > 0, torch.round(w / scale.clamp_min(1e-30)), 0.0).to(torch.int8)
        return torch.cat(
            [scale.view(torch.uint8).reshape(-1, 4), q.view(torch.uint8)], dim=1
        ).contiguous()
    if name == "q4_k":  # llama.cpp's search, native (csrc/quantize_k.cpp)
        from radixlm.kernels import build

        if not build.load():
            raise RuntimeError(
                f"q4_k quantization needs the native kernels: {build.unavailable_reason()}"
            )
        return torch.ops.radixlm.quantize_q4_k(w.contiguous())
    from gguf.quants import quantize as gguf_quantize

    return torch.from_numpy(np.ascontiguousarray(gguf_quantize(w.numpy(), fmt.ggml_type)))


def fp8_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 weights [rows, cols] and their float32 scales [rows, cols / 128] -> fp8_e4m3 rows
    (the values x = scale * q as HF's dequantization computes them, bit for bit)."""
    rows, cols = q.shape
    if cols % FP8_BLOCK or scale.shape != (rows, cols // FP8_BLOCK):
        raise ValueError(
            f"fp8_e4m3 needs columns in multiples of {FP8_BLOCK} and a scale per {FP8_BLOCK}"
            f" values: weight {tuple(q.shape)}, scales {tuple(scale.shape)}"
        )
    scaled = (scale.float() * 256.0).contiguous().view(torch.uint8).reshape(rows, -1, 4)
    values = q.contiguous().view(torch.uint8).reshape(rows, -1, FP8_BLOCK)
    return torch.cat((scaled, values), dim=-1).reshape(rows, -1).contiguous()


def dequantize_reference(q: torch.Tensor, name: str, cols: int) -> torch.Tensor:
    """The reference the kernels are tested against: gguf's numpy dequantizers (int8: scale * q;
    f16 / bf16: torch's exact widening; fp8_e4m3: torch's e4m3 times the scale)."""
    if name == "fp8_e4m3":
        blocks = q.reshape(q.shape[0], -1, 4 + FP8_BLOCK)
        scale = blocks[..., :4].contiguous().view(torch.float32) / 256.0
        values = blocks[..., 4:].contiguous().view(torch.float8_e4m3fn).float()
        return (values * scale).reshape(-1, cols)
    if name in FLOAT16:
        return (
            q.contiguous()
            .view(torch.float16 if name == "f16" else torch.bfloat16)
            .float()
            .reshape(-1, cols)
        )
    if name == "int8":
        scale = q[:, :4].contiguous().view(torch.float32)
        return q[:, 4:].contiguous().view(torch.int8).float() * scale
    from gguf.quants import dequantize as gguf_dequantize

    return torch.from_numpy(
        np.array(gguf_dequantize(q.numpy(), FORMATS[name].ggml_type), dtype=np.float32)
    ).reshape(-1, cols)
