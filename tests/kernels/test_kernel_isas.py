"""The quantized kernels' ISA levels (AVX2 tiles, AVX-512 VNNI tiles, VBMI + GFNI: MXFP4's lookups
and the decode rows' two-group kernels) give bitwise the same outputs: a server's greedy tokens must
not depend on the CPU it runs on (csrc/quant_x8*.cpp)."""

import pytest
import torch

from radixlm.kernels.formats import FORMATS, INTERLEAVED
from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor
from tests.kernels.test_quant_gemm import random_quantized


@pytest.mark.parametrize("fmt", list(INTERLEAVED))
def test_vnni_tiles_equal_avx2_tiles_bitwise(kernel_ops, fmt):
    """With AVX-512 VNNI the interleaved kernels take vpdpbusd tiles of up to 8 rows, and with VBMI
    too MXFP4's tiles look their values up by vpermb; the integer block dots are exact either way,
    so every output must be bitwise the AVX2 tiles' (a server's greedy outputs must not depend on
    the CPU it runs on), at every row count and tile remainder."""
    saved, best = kernel_ops.qlinear_levels(), kernel_ops.qlinear_isas()[-1]
    if best == "avx2":
        # Without VNNI only the AVX2 tiles exist: asking for the others is refused, by name.
        with pytest.raises(RuntimeError, match="no AVX-512 VNNI"):
            kernel_ops.qlinear_isa("avx512vnni")
        assert kernel_ops.qlinear_isa("avx2") == "avx2"
        return
    isas = ["avx512vnni", "avx512vbmi", "amx"][: kernel_ops.qlinear_isas().index(best)]
    if best == "avx512vnni":  # a VNNI CPU without VBMI (Cascade Lake): refused by name
        with pytest.raises(RuntimeError, match="no AVX-512 VBMI"):
            kernel_ops.qlinear_isa("avx512vbmi")
    g = torch.Generator().manual_seed(7)
    k = 1536  # 48 blocks: offsets over several 8-block strides
    mat = QuantizedMatrix([QuantizedTensor(random_quantized(fmt, 72, k, g), FORMATS[fmt], k)])
    assert mat.formats[0].endswith("x8")
    w, fid = mat._single
    x, bias = torch.randn(83, k, generator=g), torch.randn(72, generator=g)
    try:
        for m in (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 31, 64, 65, 83):
            kernel_ops.qlinear_isa("avx2")
            ref = kernel_ops.qlinear(x[:m], w, fid, bias)
            for isa in isas:
                kernel_ops.qlinear_isa(isa)
                assert torch.equal(kernel_ops.qlinear(x[:m], w, fid, bias), ref), f"{isa}, {m} rows"
    finally:
        kernel_ops.qlinear_levels(*saved)
    with pytest.raises(RuntimeError, match="must be 'avx2', 'avx512vnni', 'avx512vbmi' or 'amx'"):
        kernel_ops.qlinear_isa("sse2")


def test_single_row_q8_tiles_equal_avx2_at_block_tails_and_zero_blocks(kernel_ops):
    """One activation row takes Q8's 512-bit tile where the CPU has AVX-512 (csrc/x8_row1_zmm.h),
    which recovers each block's integer sum from the activation scales, 8 blocks at a time: a
    block count that is not a multiple of 8, all-zero blocks (scale 0), tiny and huge activations
    must all give the AVX2 tiles' bits."""
    saved, best = kernel_ops.qlinear_levels(), kernel_ops.qlinear_isas()[-1]
    if best == "avx2":
        # Without VNNI no 512-bit tile exists: asking for it is refused, by name.
        with pytest.raises(RuntimeError, match="no AVX-512 VNNI"):
            kernel_ops.qlinear_isa("avx512vnni")
        return
    g = torch.Generator().manual_seed(11)
    k = 1504  # 47 blocks: a tail past the 8-block strides
    mat = QuantizedMatrix([QuantizedTensor(random_quantized("q8_0", 24, k, g), FORMATS["q8_0"], k)])
    w, fid = mat._single
    x = torch.randn(4, k, generator=g)
    x[1, 64:160] = 0.0  # whole blocks of zeros
    x[2] *= 3e-37  # subnormal activation scales (and blocks below 127 / FLT_MAX: zeros)
    x[3] *= 1e30
    try:
        for row in x:
            kernel_ops.qlinear_isa("avx2")
            ref = kernel_ops.qlinear(row[None], w, fid, None)
            assert ref.isfinite().all()
            kernel_ops.qlinear_isa(best)
            assert torch.equal(kernel_ops.qlinear(row[None], w, fid, None), ref)
    finally:
        kernel_ops.qlinear_levels(*saved)


@pytest.mark.parametrize("fmt", list(INTERLEAVED))
def test_single_row_group_pairs_equal_avx2(kernel_ops, fmt):
    """At the VBMI level (with GFNI) one activation row takes 512-bit kernels that read two weight
    groups at a time (csrc/quant_x8_pair.cpp; an odd group left to the tiles): every output must
    be the AVX2 tiles' bits, with and without a bias, over group counts that leave a single group
    on a thread, zero blocks, tiny and huge activations."""
    saved, best = kernel_ops.qlinear_levels(), kernel_ops.qlinear_isas()[-1]
    if best not in ("avx512vbmi", "amx"):
        # No pair kernels on this CPU: asking for their level is refused, by name.
        with pytest.raises(RuntimeError, match="no AVX-512"):
            kernel_ops.qlinear_isa("avx512vbmi")
        return
    g = torch.Generator().manual_seed(12)
    # K-quants: 5 super-blocks; the others 47 blocks of 32 (a tail past Q8's 8-block strides)
    k = 1280 if FORMATS[fmt].block == 256 else 1504
    x = torch.randn(4, k, generator=g)
    x[1, 256:320] = 0.0  # whole blocks of zeros
    x[2] *= 3e-37
    x[3] *= 1e30
    try:
        for rows in (8, 16, 24, 88):  # 1, 2, 3 and 11 groups
            mat = QuantizedMatrix(
                [QuantizedTensor(random_quantized(fmt, rows, k, g), FORMATS[fmt], k)]
            )
            w, fid = mat._single
            bias = torch.randn(rows, generator=g)
            for row in x:
                for b in (None, bias):
                    kernel_ops.qlinear_isa("avx2")
                    ref = kernel_ops.qlinear(row[None], w, fid, b)
                    assert ref.isfinite().all()
                    kernel_ops.qlinear_isa(best)
                    got = kernel_ops.qlinear(row[None], w, fid, b)
                    assert torch.equal(got, ref), f"{rows} rows, bias {b is not None}"
    finally:
        kernel_ops.qlinear_levels(*saved)


@pytest.mark.parametrize("fmt", list(INTERLEAVED))
def test_row_tiles_over_group_pairs_equal_avx2(kernel_ops, fmt):
    """At the VBMI level more than one activation row takes 512-bit tiles over two weight groups
    at once (csrc/quant_x8_pair_tiles.cpp: a chunk of both groups per register, the activations
    broadcast; Q8 through w xor 0x80 and the activations' exact block sums), and at the AMX level
    16 rows at a time take tile multiplies for the block dots (csrc/quant_x8_amx.cpp, Q8 signed,
    Q6_K in half blocks): every output must be the AVX2 tiles' bits, in tiles of 16, 8, 4, 2 and
    1 rows, with zero blocks, tiny and huge rows."""
    saved, isas = kernel_ops.qlinear_levels(), kernel_ops.qlinear_isas()
    levels = [lv for lv in ("avx512vbmi", "amx") if lv in isas]
    if not levels:
        with pytest.raises(RuntimeError, match="no AVX-512"):
            kernel_ops.qlinear_levels("", "avx512vbmi")
        return
    if "amx" not in isas:  # refused by name where the CPU or its OS gives none
        with pytest.raises(RuntimeError, match="no AMX-INT8"):
            kernel_ops.qlinear_levels("", "amx")
    g = torch.Generator().manual_seed(13)
    k = 1280 if FORMATS[fmt].block == 256 else 1504
    x = torch.randn(40, k, generator=g)
    x[1, 256:320] = 0.0  # whole blocks of zeros
    x[2] *= 3e-37
    x[3] *= 1e30
    x[5] = 0.0
    try:
        for rows in (16, 24, 40):  # 2, 3 and 5 groups: pairs and an odd group left to the tiles
            mat = QuantizedMatrix(
                [QuantizedTensor(random_quantized(fmt, rows, k, g), FORMATS[fmt], k)]
            )
            w, fid = mat._single
            bias = torch.randn(rows, generator=g)
            for m in (2, 3, 7, 8, 15, 16, 23, 32, 40):
                for b in (None, bias):
                    kernel_ops.qlinear_levels("avx2", "avx2")
                    ref = kernel_ops.qlinear(x[:m], w, fid, b)
                    for lv in levels:
                        kernel_ops.qlinear_levels("avx2", lv)
                        got = kernel_ops.qlinear(x[:m], w, fid, b)
                        assert torch.equal(got, ref), f"{lv}: {rows} rows, {m} activation rows"
    finally:
        kernel_ops.qlinear_levels(*saved)


@pytest.mark.parametrize(
    ("sym", "asym", "offset"), [("q4_0", "q4_1", -8.0), ("q5_0", "q5_1", -16.0)]
)
def test_min_less_layouts_equal_the_stored_min_layout_bitwise(kernel_ops, sym, asym, offset):
    """Q4_0 / Q5_0 interleave at their row-major size (no m stored: the kernels make -8 d / -16 d
    from d). The same weights written as Q4_1 / Q5_1 blocks with m = -8 d / -16 d (exact in fp16)
    take the stored-min layout: every ISA level must give bitwise its outputs, one row and tiles
    alike."""
    g = torch.Generator().manual_seed(11)
    k, n = 1024, 48
    w = random_quantized(sym, n, k, g)
    blocks = w.view(n, k // 32, FORMATS[sym].block_bytes)
    d = blocks[..., :2].contiguous().view(torch.float16)
    m = (d.float() * offset).half()
    assert torch.equal(m.float(), d.float() * offset)  # exact: a power-of-two multiple
    with_min = torch.cat([blocks[..., :2], m.view(torch.uint8), blocks[..., 2:]], dim=-1)
    w_min = with_min.reshape(n, -1).contiguous()
    sym_p = kernel_ops.repack_x8(w, FORMATS[sym].kernel_id, k)
    asym_p = kernel_ops.repack_x8(w_min, FORMATS[asym].kernel_id, k)
    assert sym_p.shape[1] == 8 * FORMATS[sym].row_bytes(k) < asym_p.shape[1]  # 8 rows' own blocks
    x, bias = torch.randn(40, k, generator=g), torch.randn(n, generator=g)
    saved = kernel_ops.qlinear_levels()
    try:
        for isa in kernel_ops.qlinear_isas():
            kernel_ops.qlinear_isa(isa)
            for rows in (1, 3, 8, 17, 40):
                got = kernel_ops.qlinear(x[:rows], sym_p, INTERLEAVED[sym].kernel_id, bias)
                want = kernel_ops.qlinear(x[:rows], asym_p, INTERLEAVED[asym].kernel_id, bias)
                assert torch.equal(got, want), f"{isa}, {rows} rows"
    finally:
        kernel_ops.qlinear_levels(*saved)
    rows = torch.arange(n)
    assert torch.equal(
        kernel_ops.dequantize_rows(sym_p, INTERLEAVED[sym].kernel_id, k, rows),
        kernel_ops.dequantize_rows(asym_p, INTERLEAVED[asym].kernel_id, k, rows),
    )
