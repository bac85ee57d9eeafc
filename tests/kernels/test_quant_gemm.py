"""Quantized linear kernels against gguf's own dequantizers + float32 matmul, every format.

Two references: (1) the exact one: the kernel's own int8 activations, dequantized, times the
dequantized weight; the kernel must match it to float32 rounding, |err| <= 1e-5 * sum|x_i w_i| (a
wrong nibble, scale or block offset shows up as O(1)). (2) plain fp32 x @ W.T: then the error is
the 8-bit activation quantization's, at most half a step per value: |err| <= sum (d_i / 2) |w_i|,
d_i = the block's max|x| / 127 (relative to max|ref| that is ~0.5% for random data).
F16 / BF16 keep activations in fp32: their one reference is the widened weight times x in float64.
"""

import pytest
import torch

from radixlm.kernels.formats import (
    FLOAT16,
    FLOAT_ACTIVATIONS,
    FORMATS,
    GGUF_FORMATS,
    INTERLEAVED,
    K_ACTIVATIONS,
    dequantize_reference,
    fp8_rows,
    quantize,
)
from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor

EXACT_RTOL = 1e-5  # vs the exact reference, relative to sum |x_i w_i|
K_ACTIVATION_IDS = {f.kernel_id for f in INTERLEAVED.values() if f.name in K_ACTIVATIONS}
BLOCK_FORMATS = [n for n in FORMATS if n not in FLOAT_ACTIVATIONS]  # int8 activations


# Formats gguf has no quantizer for: where each block's fp16 scales sit (byte offset, how many).
FP16_SCALES = {
    "q4_k": (0, 2),
    "q5_k": (0, 2),
    "q6_k": (208, 1),
    "q3_k": (108, 1),
    "q2_k": (80, 2),
    "iq4_nl": (0, 1),
    "iq4_xs": (0, 1),
}


def random_quantized(name: str, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    fmt = FORMATS[name]
    if name in FP16_SCALES:  # random blocks with sane fp16 scales (d, and dmin where there is one)
        raw = torch.randint(0, 256, (rows, fmt.row_bytes(cols)), dtype=torch.uint8, generator=g)
        blocks = raw.view(rows, -1, fmt.block_bytes)
        scales = (
            (torch.rand(rows, blocks.shape[1], 2, generator=g) * 0.02 + 1e-3)
            .half()
            .view(torch.uint8)
        )
        at, count = FP16_SCALES[name]
        blocks[:, :, at : at + 2 * count] = scales.reshape(rows, -1, 4)[:, :, : 2 * count]
        return raw
    return quantize(torch.randn(rows, cols, generator=g), name)


def act_grid(kernel_ops, x, kernel_id=None):
    """x on the kernel's int8 grid and each value's step: per 32 values, or per 256 for the formats
    that take Q8_K activations (K_ACTIVATIONS)."""
    if kernel_id in K_ACTIVATION_IDS:
        q, d, _ = kernel_ops.quantize_act_k(x)
        block = 256
    else:
        q, d, _ = kernel_ops.quantize_act(x)
        block = 32
    xa = (q.float().view(x.shape[0], -1, block) * d[:, :, None]).view_as(x)
    return xa, d.repeat_interleave(block, dim=1)


def exact_reference(kernel_ops, x, w_ref, kernel_id=None):
    return act_grid(kernel_ops, x, kernel_id)[0] @ w_ref.T


def dot_err(y, ref, x, w):
    """max |y - ref| relative to sum_i |x_i w_i|, the scale of a dot product's rounding error."""
    return ((y - ref).abs() / (x.abs() @ w.abs().T).clamp_min(1e-30)).max().item()


def act_q8_bound(kernel_ops, x, w, kernel_id=None):
    return (act_grid(kernel_ops, x, kernel_id)[1] / 2) @ w.abs().T


def check_kernel(kernel_ops, w, kernel_id, w_ref, m, g, label):
    """Weight `w` (stored as kernel_id) against its dequantized reference w_ref [n, k]: dequantize
    and row lookups exact, and qlinear on m random rows within both references' bounds."""
    n, k = w_ref.shape
    assert torch.equal(kernel_ops.dequantize(w, kernel_id, k), w_ref), f"{label}: dequantize"
    ids = torch.randint(0, n, (5,), generator=g)
    assert torch.equal(kernel_ops.dequantize_rows(w, kernel_id, k, ids), w_ref[ids])
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g)
    y = kernel_ops.qlinear(x, w, kernel_id, bias)
    assert y.shape == (m, n)
    e_exact = dot_err(y - bias, exact_reference(kernel_ops, x, w_ref, kernel_id), x, w_ref)
    assert e_exact < EXACT_RTOL, f"{label} {m}x{k}x{n}: {e_exact:.2e} vs the exact reference"
    err_fp32 = (y - (x @ w_ref.T + bias)).abs()
    bound = act_q8_bound(kernel_ops, x, w_ref, kernel_id) * (1 + 1e-4) + EXACT_RTOL * (
        x.abs() @ w_ref.abs().T
    )
    assert (err_fp32 <= bound).all(), f"{label} {m}x{k}x{n}: beyond the 8-bit activation bound"


# (activation rows M, weight rows, blocks): odd row counts (not multiples of the 2- and 4-row
# tiles).
SHAPES = [
    (1, 37, 1),
    (2, 64, 2),
    (3, 1, 3),
    (4, 130, 1),
    (5, 17, 2),
    (7, 96, 3),
    (13, 33, 1),
    (31, 40, 2),
    (64, 9, 1),
    (8, 67, 2),
    (17, 3, 1),
    (1, 67, 3),
]


@pytest.mark.parametrize("name", BLOCK_FORMATS)
def test_qlinear_matches_dequantized_reference(kernel_ops, name):
    g = torch.Generator().manual_seed(list(FORMATS).index(name))
    fmt = FORMATS[name]
    for m, n, blocks in SHAPES:
        k = blocks * fmt.block
        w = random_quantized(name, n, k, g)
        w_ref = dequantize_reference(w, name, k)
        check_kernel(kernel_ops, w, fmt.kernel_id, w_ref, m, g, name)


@pytest.mark.parametrize("name", list(INTERLEAVED))
def test_interleaved_layout_matches_dequantized_reference(kernel_ops, name):
    """The 8-row interleaved repack keeps every value (dequantize and row lookups are exact) and its
    kernel meets the same two references as the row-major one, at 1-64 rows and 8-64 columns."""
    g = torch.Generator().manual_seed(10 + list(INTERLEAVED).index(name))
    src, packed = FORMATS[name], INTERLEAVED[name]
    for m, n, blocks in [
        (1, 8, 1),
        (2, 16, 3),
        (3, 40, 2),
        (4, 8, 5),
        (5, 64, 1),
        (13, 24, 2),
        (64, 32, 3),
        (37, 56, 1),
    ]:
        k = blocks * src.block
        w = random_quantized(name, n, k, g)
        w_ref = dequantize_reference(w, name, k)
        p = kernel_ops.repack_x8(w, src.kernel_id, k)
        assert p.shape == (n // 8, packed.row_bytes(k))
        check_kernel(kernel_ops, p, packed.kernel_id, w_ref, m, g, packed.name)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        kernel_ops.repack_x8(
            random_quantized(name, 12, src.block * 2, g), src.kernel_id, src.block * 2
        )


def test_matrices_with_rows_in_eights_are_interleaved(kernel_ops):
    g = torch.Generator().manual_seed(11)
    for name, rows in (
        ("q4_1", 48),
        ("q4_0", 16),
        ("q8_0", 24),
        ("q4_1", 50),
        ("q4_k", 16),
        ("q6_k", 12),
        ("q5_k", 16),
    ):
        k = FORMATS[name].block * 2
        mat = QuantizedMatrix(
            [QuantizedTensor(random_quantized(name, rows, k, g), FORMATS[name], k)]
        )
        want = INTERLEAVED[name].name if name in INTERLEAVED and rows % 8 == 0 else name
        assert mat.formats == [want] and mat.rows == rows


def test_quantize_act_rounds_to_nearest(kernel_ops):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 96, generator=g) * torch.tensor([1e-3, 1, 10, 100, 0.5, 3])[:, None]
    x[2, :32] = 0  # an all-zero block: scale 0, values 0
    q, d, s = kernel_ops.quantize_act(x)
    blocks = x.view(6, 3, 32)
    assert torch.allclose(d, blocks.abs().amax(-1) / 127, rtol=1e-6, atol=0)
    recon = q.float().view(6, 3, 32) * d[:, :, None]
    assert ((recon - blocks).abs() <= d[:, :, None] * 0.5 * (1 + 1e-5)).all()
    assert torch.allclose(s, d * q.float().view(6, 3, 32).sum(-1), rtol=1e-6)
    assert q.view(6, 3, 32)[2, 0].abs().sum() == 0 and d[2, 0] == 0


def test_quantize_act_k_rounds_to_nearest(kernel_ops):
    """Q8_K activations: one scale per 256 values, round to nearest, and each 32 values' two
    16-value sums packed as int16 halves (low: values 0..15)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 768, generator=g) * torch.tensor([1e-3, 1, 10, 100, 0.5])[:, None]
    x[2, :256] = 0  # an all-zero super-block: scale 0, values 0
    x[3, 300] = 5e3  # an outlier sets its super-block's step alone
    q, d, s16 = kernel_ops.quantize_act_k(x)
    blocks = x.view(5, 3, 256)
    assert torch.allclose(d, blocks.abs().amax(-1) / 127, rtol=1e-6, atol=0)
    recon = q.float().view(5, 3, 256) * d[:, :, None]
    assert ((recon - blocks).abs() <= d[:, :, None] * 0.5 * (1 + 1e-5)).all()
    halves = q.view(5, 24, 2, 16).sum(-1, dtype=torch.int32)
    assert torch.equal(s16 & 0xFFFF, halves[..., 0] & 0xFFFF)
    assert torch.equal(s16 >> 16, halves[..., 1])
    assert q.view(5, 3, 256)[2, 0].abs().sum() == 0 and d[2, 0] == 0


def test_qlinear_out_writes_a_column_slice(kernel_ops):
    g = torch.Generator().manual_seed(2)
    w = quantize(torch.randn(24, 64, generator=g), "q8_0")
    x = torch.randn(3, 64, generator=g)
    out = torch.full((3, 40), 7.0)
    kernel_ops.qlinear_out(x, w, FORMATS["q8_0"].kernel_id, None, out[:, 10:34])
    assert torch.equal(out[:, :10], torch.full((3, 10), 7.0)) and torch.equal(
        out[:, 34:], torch.full((3, 6), 7.0)
    )
    w_ref = dequantize_reference(w, "q8_0", 64)
    assert dot_err(out[:, 10:34], exact_reference(kernel_ops, x, w_ref), x, w_ref) < EXACT_RTOL


@pytest.mark.parametrize("rows", [1, 3, 31, 32, 70])
def test_mixed_format_matrix(kernel_ops, rows):
    """A fused layer whose shards come in different formats (Q4_K_M: q/k Q4_K, v Q6_K) or float."""
    g = torch.Generator().manual_seed(3)
    k = 512
    parts = [
        QuantizedTensor(random_quantized("q4_k", 20, k, g), FORMATS["q4_k"], k),
        QuantizedTensor(random_quantized("q4_k", 12, k, g), FORMATS["q4_k"], k),
        QuantizedTensor(random_quantized("q6_k", 9, k, g), FORMATS["q6_k"], k),
        torch.randn(5, k, generator=g),
    ]
    mat = QuantizedMatrix(parts)
    assert (
        mat.formats == ["q4_kx8", "q6_k", "torch.float32"] and mat.rows == 46
    )  # 32 q4_k rows: interleaved
    w_ref = torch.cat(
        [
            dequantize_reference(p.data, p.fmt.name, k) if isinstance(p, QuantizedTensor) else p
            for p in parts
        ]
    )
    assert torch.equal(mat.dequantize(), w_ref)
    x = torch.randn(rows, k, generator=g)
    bias = torch.randn(46, generator=g)
    y = mat.matmul(x, bias)
    # Quantized shards see int8-grid activations at every batch size (per 256 values for Q4_KX8,
    # per 32 for the row-major Q6_K); the float shard never does.
    xk = act_grid(kernel_ops, x, INTERLEAVED["q4_k"].kernel_id)[0]
    xq = act_grid(kernel_ops, x)[0]
    ref = torch.cat([xk @ w_ref[:32].T, xq @ w_ref[32:41].T, x @ w_ref[41:].T], dim=1) + bias
    assert dot_err(y - bias, ref - bias, x, w_ref) < EXACT_RTOL
    ids = torch.tensor([[0, 45], [21, 33]])
    assert torch.equal(mat.embedding(ids), w_ref[ids])


@pytest.mark.parametrize("rows", [51, 56])  # 56: the interleaved layout where the format has one
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_rows_do_not_depend_on_the_batch(kernel_ops, fmt, rows):
    """A row's output is bitwise the same alone, in any tile of a small batch and in a large one
    (and for odd column counts): prompt logprobs and greedy outputs must not depend on what else
    is batched, since the next layer rounds activations to an int8 grid."""
    g = torch.Generator().manual_seed(4)
    k = 512
    w = random_quantized(fmt, rows, k, g)
    mat = QuantizedMatrix([QuantizedTensor(w, FORMATS[fmt], k)])
    x = torch.randn(150, k, generator=g)
    full = mat.matmul(x)
    for lo, hi in ((0, 1), (5, 6), (3, 6), (1, 9), (64, 70), (60, 133), (149, 150)):
        assert torch.equal(mat.matmul(x[lo:hi].clone()), full[lo:hi]), f"rows {lo}:{hi}"


@pytest.mark.parametrize("name", list(FORMATS))
def test_kernel_rows_equal_single_row_calls(kernel_ops, name):
    """The op itself (no matrix wrapper): row i of qlinear(x) is bitwise qlinear(x[i:i+1]), for
    every M in the tile remainders and an odd number of weight rows."""
    g = torch.Generator().manual_seed(5)
    fmt = FORMATS[name]
    k = 2 * fmt.block if fmt.block > 1 else 67  # 16-bit floats: 8-value chunks and a tail of 3
    w = random_quantized(name, 67, k, g)
    x, bias = torch.randn(64, k, generator=g), torch.randn(67, generator=g)
    singles = torch.cat(
        [kernel_ops.qlinear(x[i : i + 1].clone(), w, fmt.kernel_id, bias) for i in range(64)]
    )
    for m in (1, 2, 3, 5, 8, 17, 64):
        assert torch.equal(
            kernel_ops.qlinear(x[:m].clone(), w, fmt.kernel_id, bias), singles[:m]
        ), f"M = {m}"


def test_block_formats_match_gguf_sizes():
    """Every GGUF format listed is the GGUF type of the same name, block for block (the loader keeps
    such tensors as they are)."""
    import gguf

    for name in GGUF_FORMATS:
        fmt = FORMATS[name]
        assert gguf.GGML_QUANT_SIZES[fmt.ggml_type] == (fmt.block, fmt.block_bytes), name


def test_bad_weights_are_refused_by_name(kernel_ops):
    w = quantize(torch.randn(4, 64), "q4_0")
    with pytest.raises(RuntimeError, match="row_bytes|bytes"):
        kernel_ops.qlinear(torch.randn(1, 96), w, FORMATS["q4_0"].kernel_id, None)
    with pytest.raises(RuntimeError, match="unknown quantized format"):
        kernel_ops.qlinear(torch.randn(1, 64), w, 99, None)
    with pytest.raises(RuntimeError, match="out of range"):
        kernel_ops.dequantize_rows(w, FORMATS["q4_0"].kernel_id, 64, torch.tensor([4]))
    with pytest.raises(ValueError, match="multiples of 32"):
        quantize(torch.randn(4, 48), "q8_0")


# (activation rows M, weight rows, in_features): K below, at and past the 8-value chunks with
# ragged tails; M over the 1 x 4 (decode) and 4 x 2 tiles' remainders.
FLOAT16_SHAPES = [
    (1, 37, 1),
    (1, 67, 8),
    (2, 64, 9),
    (3, 1, 515),
    (4, 130, 64),
    (5, 17, 23),
    (7, 96, 130),
    (13, 33, 1000),
    (64, 9, 40),
    (70, 67, 17),
    (1, 4, 4096),
]


def float_dot_bound(x, w, bias=None):
    """The fp32 error bound of the kernels' dot (gamma_n (sum_i |x_i w_i| + |b|)): a product passes
    through at most n = K // 8 chunk FMAs + 3 hsum adds + K % 8 tail adds (+ 1 multiply there) + the
    bias add, each rounding by at most 2^-24 (1.01: gamma_n's n u / (1 - n u) and float64's own)."""
    k = x.shape[1]
    n = k // 8 + 3 + k % 8 + 1 + 1
    mag = x.abs().double() @ w.abs().double().T
    if bias is not None:
        mag = mag + bias.abs().double()
    return 1.01 * n * 2.0**-24 * mag


@pytest.mark.parametrize("name", FLOAT16)
def test_float16_qlinear_matches_fp64_reference(kernel_ops, name):
    """F16 / BF16 weights: dequantize and row lookups are torch's widening bitwise, and qlinear on
    fp32 activations is the float64 product of x and the widened weight within fp32 accumulation."""
    g = torch.Generator().manual_seed(20 + FLOAT16.index(name))
    fid = FORMATS[name].kernel_id
    for m, n, k in FLOAT16_SHAPES:
        w = quantize(torch.randn(n, k, generator=g), name)
        assert w.shape == (n, 2 * k) and w.dtype == torch.uint8
        w_ref = dequantize_reference(w, name, k)
        assert torch.equal(kernel_ops.dequantize(w, fid, k), w_ref), f"{name}: dequantize"
        ids = torch.randint(0, n, (5,), generator=g)
        assert torch.equal(kernel_ops.dequantize_rows(w, fid, k, ids), w_ref[ids])
        x, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
        y = kernel_ops.qlinear(x, w, fid, bias)
        ref = x.double() @ w_ref.double().T + bias.double()
        assert ((y.double() - ref).abs() <= float_dot_bound(x, w_ref, bias)).all(), (
            f"{name} {m}x{k}x{n}"
        )


@pytest.mark.parametrize("name", FLOAT16)
def test_float16_widening_is_exact_over_all_bit_patterns(kernel_ops, name):
    """Every finite 16-bit pattern (subnormals, extremes, -0) widens as torch does, in the 8-value
    chunks and the scalar tail alike (a row of 65535 values ends in a tail of 7)."""
    bits = torch.arange(0, 65536, dtype=torch.int32)
    exp_all_ones = (bits >> 10 & 0x1F) == 0x1F if name == "f16" else (bits >> 7 & 0xFF) == 0xFF
    bits = bits[~exp_all_ones]
    bits = torch.cat([bits, bits[: 7 - (bits.numel() % 8) + 8]])  # a ragged tail
    w = bits.to(torch.int16).view(torch.uint8).reshape(1, -1)
    k = bits.numel()
    ref = dequantize_reference(w, name, k)
    assert torch.isfinite(ref).all() and k % 8 != 0
    assert torch.equal(kernel_ops.dequantize(w, FORMATS[name].kernel_id, k), ref)


@pytest.mark.parametrize("name", FLOAT16)
def test_float16_embedding_and_lm_head(kernel_ops, name):
    """A tied embedding kept 16-bit: the lookup is the widened rows bitwise, the LM head the
    widened weight's product."""
    from radixlm.model.layers.linear import VocabEmbedding

    g = torch.Generator().manual_seed(30)
    vocab, hidden = 101, 72
    w = quantize(torch.randn(vocab, hidden, generator=g), name)
    emb = VocabEmbedding(vocab, hidden)
    emb.set_quantized([QuantizedTensor(w, FORMATS[name], hidden)])
    assert emb.qweight.formats == [name] and emb.qweight.nbytes == vocab * hidden * 2
    w_ref = dequantize_reference(w, name, hidden)
    ids = torch.tensor([[0, 100, 7], [55, 55, 3]])
    assert torch.equal(emb(ids), w_ref[ids])
    h = torch.randn(2, 3, hidden, generator=g)
    logits = emb.as_lm_head(h)
    assert logits.shape == (2, 3, vocab)
    ref = h.reshape(-1, hidden).double() @ w_ref.double().T
    assert (
        (logits.reshape(-1, vocab).double() - ref).abs()
        <= float_dot_bound(h.reshape(-1, hidden), w_ref)
    ).all()


def test_fp8_widening_is_exact_over_all_bit_patterns(kernel_ops):
    """Every finite e4m3 byte (subnormals, +-448, -0) times its block's scale, as torch's e4m3 ->
    float32 times the scale computes it, bit for bit: in dequantize and in the kernel's chunks."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    q = finite.repeat(2)[:256].view(torch.float8_e4m3fn).reshape(2, 128)
    for scale in (1.0, 3.0e-5, 0.0123, 7.5):
        w = fp8_rows(q, torch.full((2, 1), scale))
        ref = q.float() * torch.tensor(scale, dtype=torch.float32)
        assert torch.equal(dequantize_reference(w, "fp8_e4m3", 128), ref)
        assert torch.equal(kernel_ops.dequantize(w, FORMATS["fp8_e4m3"].kernel_id, 128), ref)
        eye = torch.eye(128)  # qlinear of the identity: each weight alone through the FMA chain
        out = kernel_ops.qlinear(eye, w, FORMATS["fp8_e4m3"].kernel_id, None)
        assert torch.equal(out, ref.T), f"scale {scale}"


def fp8_dot_bound(x, w, bias):
    """float_dot_bound's for the FP8 kernel's order: a product passes through at most the 16 FMAs
    of its 128-value block's chain, the FMA of that chain by the block's scale (x (q s) is
    computed as (x q) s: one more rounding against the reference's rounded weight), the K / 128
    block FMAs into the row's sum, 3 hsum adds and the bias add."""
    n = 16 + 1 + x.shape[1] // 128 + 3 + 1 + 1
    mag = x.abs().double() @ w.abs().double().T + bias.abs().double()
    return 1.01 * n * 2.0**-24 * mag


def test_fp8_qlinear_matches_fp64_reference(kernel_ops):
    """FP8 e4m3 weights with a float32 scale per 128 values (per channel and 128 x 128 blocks
    alike): qlinear on fp32 activations is the float64 product of x and the dequantized weight
    within fp32 accumulation (the weight's one rounding is its own product q * s, exact as HF's)."""
    g = torch.Generator().manual_seed(40)
    fid = FORMATS["fp8_e4m3"].kernel_id
    for m, n, k in [(1, 37, 128), (1, 64, 4096), (3, 9, 256), (4, 130, 384), (13, 33, 512)]:
        w = quantize(torch.randn(n, k, generator=g), "fp8_e4m3")
        assert w.shape == (n, k // 128 * 132) and w.dtype == torch.uint8
        w_ref = dequantize_reference(w, "fp8_e4m3", k)
        x, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
        y = kernel_ops.qlinear(x, w, fid, bias)
        ref = x.double() @ w_ref.double().T + bias.double()
        assert ((y.double() - ref).abs() <= fp8_dot_bound(x, w_ref, bias)).all(), f"{m}x{k}x{n}"
    with pytest.raises(ValueError, match="multiples of 128"):
        fp8_rows(torch.zeros(2, 96).to(torch.float8_e4m3fn), torch.ones(2, 1))
