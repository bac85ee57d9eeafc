"""The tile-level pieces the kernels share (@triton.jit helpers, inlined where they are called): the
two dot-product paths, flash attention's online-softmax step over a tile of keys read from the KV
pool by slot, its attention-sink step, and a rows-times-weights GEMM tile (MoE's grouped GEMM,
LoRA's segments)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def dot(a, b, F32_DOT: tl.constexpr):
    """a @ b with float32 accumulation: in float32 at IEEE precision (no TF32) when F32_DOT, else on
    a's dtype (the tensor cores' bfloat16 / float16)."""
    if F32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype))


@triton.jit
def attend_tile(
    q,
    K_buf,
    V_buf,
    slots,
    kv_valid,
    visible,
    kvh,
    offs_d,
    d_valid,
    m_i,
    l_i,
    acc,
    sm_scale,
    logit_cap,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    HAS_CAP: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """One tile of keys at pool `slots` (kv_valid: the real ones) for the query rows q [M, D]:
    visible [M, N] says which key each row sees. Returns the updated running max, sum and output."""
    kv_mask = kv_valid[:, None] & d_valid[None, :]
    k = tl.load(
        K_buf + slots[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    s = dot(q, tl.trans(k), F32_DOT) * sm_scale
    if HAS_CAP:
        s = logit_cap * tanh(s / logit_cap)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(
        m_i, tl.max(s, 1)
    )  # m_i starts finite: a row with nothing visible stays as it was
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        V_buf + slots[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    return m_new, l_i, acc * alpha[:, None] + dot(p.to(q.dtype), v, F32_DOT)


@triton.jit
def add_sink(Sinks, h, m_i, l_i, acc):
    """Attention sinks: head h's sink logit joins the running max and denominator of the rows
    (after the last tile; it adds no value, so acc is only rescaled)."""
    sink = tl.load(Sinks + h).to(tl.float32)
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp(m_i - m_new)
    return m_new, l_i * alpha + tl.exp(sink - m_new), acc * alpha[:, None]


@triton.jit
def rows_times_wt(
    X,
    rows,
    row_valid,
    stride_xm,
    stride_xk,
    W,
    offs_n,
    n_valid,
    stride_wn,
    stride_wk,
    K,
    k_end,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """X[rows] @ W^T for W's rows offs_n ([BLOCK_M, BLOCK_N], float32), over K in BLOCK_K steps up
    to k_end (0: nothing read)."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        k_valid = (k0 + offs_k) < K
        x = tl.load(
            X + rows[:, None] * stride_xm + (k0 + offs_k)[None, :] * stride_xk,
            mask=row_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        w = tl.load(
            W + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None] * stride_wk,
            mask=k_valid[:, None] & n_valid[None, :],
            other=0.0,
        )
        acc += dot(x, w, F32_DOT)
    return acc
