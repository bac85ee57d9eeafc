"""AWQ / GPTQ packed int32 tensors -> the native CPU kernels' GGUF blocks (kernels/formats.py).

Both formats hold w[out, in] = (q - z[g]) * s[g], g the group of input row `in`:
- AWQ (AutoAWQ GEMM): qweight int32 [in, out/8], qzeros int32 [groups, out/8], scales [groups, out];
  each int32 packs 8 output columns, nibble i holding column AWQ_ORDER[i]; z as stored.
- GPTQ: qweight int32 [in*bits/32, out] packed along the input (value j of an int32 at bits*j),
  qzeros int32 [groups, out*bits/32] packed the same way along the output, scales [groups, out],
  g_idx int32 [in]; v1 checkpoints store z - 1 (AutoGPTQ's kernels add the 1 back, unmasked).

Each 32-value block of a row lies in one group (group sizes are multiples of 32), so it takes the
group's scale: 4-bit -> Q4_1 with d = s and m = -s*z (m rounded to f16, the one inexact step; all
zeros 8, GPTQ's symmetric case, -> Q4_0 with d = s, exact); 8-bit symmetric (z = 128) -> Q8_0 with
d = s and q - 128, exact. Act-order (GPTQ desc_act: groups not contiguous) sorts the input rows by
group first; the caller permutes the activations the same way (layers/permuted_matrix.py).
"""

from __future__ import annotations

import torch

from radixlm.kernels.formats import FORMATS
from radixlm.model.layers.quantized import QuantizedTensor

# AutoAWQ's pack order: nibble i of an int32 holds output column AWQ_ORDER[i] of its 8.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
BLOCK = 32


def unpack_int32(packed: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """int32 [..., n] -> uint8 [..., n, 32/bits]: value j of each int32 (from bit bits*j) at
    position order[j] (default j). One value plane at a time: a byte per value, never an int32."""
    per, mask = 32 // bits, (1 << bits) - 1
    packed = packed.to(torch.int32)
    out = torch.empty(*packed.shape, per, dtype=torch.uint8)
    for j in range(per):
        out[..., j if order is None else order[j]] = ((packed >> (bits * j)) & mask).to(torch.uint8)
    return out


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ GEMM -> (q uint8 [out, in], z int32 [groups, out])."""
    q = unpack_int32(qweight, 4, AWQ_ORDER).reshape(qweight.shape[0], -1)
    z = unpack_int32(qzeros, 4, AWQ_ORDER).reshape(qzeros.shape[0], -1)
    return q.T.contiguous(), z.to(torch.int32)


def unpack_gptq(
    qweight: torch.Tensor, qzeros: torch.Tensor, bits: int, zero_offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ -> (q uint8 [out, in], z int32 [groups, out]); zero_offset 1 for v1 checkpoints."""
    # qweight [in*bits/32, out]: the values of one int32 are consecutive input rows.
    q = unpack_int32(qweight.T, bits).reshape(qweight.shape[1], -1)
    z = unpack_int32(qzeros, bits).reshape(qzeros.shape[0], -1).to(torch.int32) + zero_offset
    return q, z


def default_g_idx(cols: int, group_size: int) -> torch.Tensor:
    """The groups of input rows in order (no act-order); group_size -1: one group."""
    return (
        torch.zeros(cols, dtype=torch.int64)
        if group_size == -1
        else torch.arange(cols) // group_size
    )


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).view(*x.shape, 2)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """[out, blocks, 32] codes 0..15 -> GGML's 16 bytes per block: low nibble value j, high j+16."""
    return q[..., :16] | (q[..., 16:] << 4)


def repack(
    q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, g_idx: torch.Tensor, bits: int, name: str
) -> tuple[QuantizedTensor, torch.Tensor | None]:
    """(q [out, in], z and s [groups, out], g_idx [in]) -> (the blocks, the input permutation or
    None). `name` (the tensor's) is for the refusals."""
    rows, cols = q.shape
    if cols % BLOCK:
        raise ValueError(f"{name}: {cols} input columns are not whole blocks of {BLOCK}")
    g_idx = g_idx.to(torch.int64)
    if g_idx.shape != (cols,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= s.shape[0]:
        raise ValueError(f"{name}: g_idx does not index its {s.shape[0]} groups")
    perm = None
    if bool((g_idx[1:] < g_idx[:-1]).any()):  # act-order: make each group's rows contiguous
        perm = torch.argsort(g_idx, stable=True)
        q, g_idx = q[:, perm], g_idx[perm]
    per_block = g_idx.view(-1, BLOCK)
    if not bool((per_block == per_block[:, :1]).all()):
        raise ValueError(f"{name}: a group is not whole blocks of {BLOCK} input rows")
    group = per_block[:, 0]
    d = s[group].T.float()  # [out, blocks]: each block's group scale
    zb = z[group].T  # [out, blocks]
    qb = q.view(rows, -1, BLOCK)
    if bits == 8:
        if not bool((zb == 128).all()):
            raise ValueError(f"{name}: 8-bit zeros other than 128 (sym false) are not supported")
        body = (qb.to(torch.int16) - 128).to(torch.int8).view(torch.uint8)
        fmt, parts = "q8_0", [_f16_bytes(d), body]
    elif bool((zb == 8).all()):  # symmetric 4-bit: Q4_0's own offset, exact
        fmt, parts = "q4_0", [_f16_bytes(d), _nibbles(qb)]
    else:
        # s*z is exact in float32 (11 x 5 significant bits); its f16 rounding is the inexact step.
        fmt, parts = "q4_1", [_f16_bytes(d), _f16_bytes(-d * zb.float()), _nibbles(qb)]
    data = torch.cat(parts, dim=-1).reshape(rows, -1)
    return QuantizedTensor(data, FORMATS[fmt], cols), perm
