"""FP8 weights on the GPU (W8A16): y = x @ dequant(W)^T, W float8_e4m3fn with float32 scales, x and
y in the activations' dtype (bfloat16 on CUDA).

Each program computes a [BLOCK_M, BLOCK_N] tile of y over its share of K: it loads the FP8 weight
tile once, widens it in registers to the activations' type (exact: every e4m3 value is a bfloat16
and a float16) and accumulates x @ w^T in float32 on the tensor cores; the scales multiply the
float32 accumulator, once at the end for per-output-channel scales (S [N]), once per K tile for
128 x 128 block scales (S [cdiv(N, 128), cdiv(K, 128)]; BLOCK_K divides 128 in every config).
Split-K (SPLIT_K > 1) gives each program a contiguous share of the K tiles and writes its float32
partial tile to P [SPLIT_K, M, N]; the wrapper sums them (a fixed order: no atomics, so a result
never depends on which program finished first).

The configs are tuned on the GPU on first use (triton.autotune), one tuner per M bucket (1, <= 16,
<= 32, <= 64: decode; larger: prefill) keyed on N, K and the scale layout: small M gets BLOCK_M 16
with narrow N tiles and split-K (a decode GEMM is a read of the weights, and N / BLOCK_N programs
alone do not fill the GPU), M <= 64 BLOCK_M 32 / 64, prefill the same kernel with 64 / 128-row
tiles (no dequantize-then-matmul fallback: every M reads the FP8 weight once per tile). Under
Triton's interpreter (CPU tests) nothing is tuned: a fixed config, or the one a test names.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import dot_in_f32, interpreting
from radixlm.kernels.triton_ops.tiles import dot

SCALE_BLOCK = 128  # DeepSeek-V3's / SGLang's 128 x 128 weight blocks


@triton.jit
def _fp8_gemm_kernel(
    X,
    W,
    S,
    Y,
    P,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sk,
    stride_ym,
    stride_yn,
    SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """Y = X @ (W * scales)^T for one [BLOCK_M, BLOCK_N] tile and split program_id(2) of K."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_valid = offs_m < M
    n_valid = offs_n < N
    rows = offs_m.to(tl.int64)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, k_tiles)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for t in range(first, last):
        k = t * BLOCK_K + offs_k
        k_valid = k < K
        x = tl.load(
            X + rows[:, None] * stride_xm + k[None, :] * stride_xk,
            mask=m_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        w = tl.load(
            W + offs_n[None, :] * stride_wn + k[:, None] * stride_wk,
            mask=k_valid[:, None] & n_valid[None, :],
            other=0.0,
        )
        part = dot(x, w, F32_DOT)  # w widened in registers to x's type (exact), fp32 accumulate
        if SCALE_BLOCK > 0:
            s = tl.load(
                S + (offs_n // SCALE_BLOCK) * stride_sn + (t * BLOCK_K // SCALE_BLOCK) * stride_sk,
                mask=n_valid,
                other=0.0,
            )
            acc += part * s[None, :]
        else:
            acc += part
    if SCALE_BLOCK == 0:
        acc = acc * tl.load(S + offs_n * stride_sn, mask=n_valid, other=0.0)[None, :]
    mask = m_valid[:, None] & n_valid[None, :]
    if SPLIT_K == 1:
        tl.store(
            Y + rows[:, None] * stride_ym + offs_n[None, :] * stride_yn,
            acc.to(Y.dtype.element_ty),
            mask=mask,
        )
    else:
        tl.store(P + (pid_k * M + rows[:, None]) * N + offs_n[None, :], acc, mask=mask)


def _config(bm: int, bn: int, bk: int, split: int, warps: int, stages: int) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split},
        num_warps=warps,
        num_stages=stages,
    )


# What the GPU tries on first use, per M bucket (the Llama-3-8B decode shapes: N 4096 / 6144 /
# 28672, K 4096 / 14336; an H100 / H200 has 132 SMs).
SMALL_M = [  # M <= 16: a weight read; more programs through narrow N tiles or split-K
    _config(16, 32, 128, 1, 4, 4),
    _config(16, 64, 128, 1, 4, 4),
    _config(16, 128, 128, 1, 4, 3),
    _config(16, 64, 128, 2, 4, 4),
    _config(16, 64, 128, 4, 4, 4),
    _config(16, 32, 128, 4, 4, 4),
    _config(16, 128, 64, 4, 4, 4),
]
MEDIUM_M = [  # 16 < M <= 64
    _config(32, 64, 128, 1, 4, 4),
    _config(32, 128, 128, 1, 4, 3),
    _config(32, 64, 128, 2, 4, 4),
    _config(64, 64, 128, 1, 4, 4),
    _config(64, 128, 128, 1, 8, 3),
    _config(64, 64, 128, 2, 4, 4),
]
LARGE_M = [  # prefill
    _config(64, 128, 64, 1, 4, 4),
    _config(128, 128, 64, 1, 8, 3),
    _config(128, 64, 128, 1, 4, 3),
]
BUCKETS = {1: SMALL_M, 16: SMALL_M, 32: MEDIUM_M, 64: MEDIUM_M, 0: LARGE_M}
# Under the interpreter (tests): one config per bucket, wide tiles (few programs: the interpreter's
# cost); a test may name any of the lists' configs.
INTERPRETER = {1: SMALL_M[2], 16: SMALL_M[2], 32: MEDIUM_M[1], 64: MEDIUM_M[1], 0: LARGE_M[1]}


def m_bucket(m: int) -> int:
    """The tuning bucket of M rows: 1, 16, 32, 64 (decode batches), 0 for anything larger."""
    for b in (1, 16, 32, 64):
        if m <= b:
            return b
    return 0


def _bench(fn, quantiles):
    """Autotune's timing, shorter than triton's default (25 ms warm-up, 100 ms): a decode GEMM
    takes microseconds, and start-up tunes four M buckets of every weight shape."""
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


_TUNERS: dict[int, object] = {}


def tuner(bucket: int):
    """The bucket's autotuned launcher (made on first use; its cache: N, K, scales, dtypes)."""
    if bucket not in _TUNERS:
        _TUNERS[bucket] = triton.autotune(
            BUCKETS[bucket], key=["N", "K", "SCALE_BLOCK"], do_bench=_bench
        )(_fp8_gemm_kernel)
    return _TUNERS[bucket]


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    scale_block: int = 0,
    config: triton.Config | None = None,
) -> torch.Tensor:
    """x [M, K] (bfloat16, float16 or float32) @ (weight [N, K] float8_e4m3fn x scale)^T -> [M, N]
    in x's dtype. scale: float32 [N] (scale_block 0: per output channel) or [cdiv(N, b),
    cdiv(K, b)] (scale_block b = 128). config: run this one (tests); None: the bucket's tuned one
    (the interpreter's fixed one under TRITON_INTERPRET)."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bucket = m_bucket(m)
    if config is None and interpreting():
        config = INTERPRETER[bucket]
    kernel = _fp8_gemm_kernel if config is not None else tuner(bucket)
    meta = config.all_kwargs() if config is not None else {}
    # P holds split-K's partial tiles: as many as the bucket's configs may ask for.
    most = max(c.kwargs["SPLIT_K"] for c in ([config] if config is not None else BUCKETS[bucket]))
    partial = torch.empty((most, m, n), dtype=torch.float32, device=x.device) if most > 1 else y
    s_n, s_k = (scale.stride(0), scale.stride(1)) if scale.dim() == 2 else (scale.stride(0), 0)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]), meta["SPLIT_K"])

    kernel[grid](
        x,
        weight,
        scale,
        y,
        partial,
        m,
        n,
        k,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        s_n,
        s_k,
        y.stride(0),
        y.stride(1),
        SCALE_BLOCK=scale_block,
        F32_DOT=dot_in_f32(x.dtype),
        **meta,
    )
    split = (config if config is not None else kernel.best_config).kwargs["SPLIT_K"]
    if split > 1:
        return partial[:split].sum(0).to(x.dtype)
    return y
