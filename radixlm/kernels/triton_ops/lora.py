"""LoRA's batched delta on the GPU: segmented gather matmul (punica's / SGLang's sgmv).

A batch's tokens come in segments, one per request (its new tokens are consecutive), each under
one adapter slot (-1: the base model, no delta). Shrink: delta[seg] = x[seg] @ A[slot]^T, the rank
blocks of every part of a fused layer at once; expand: out[seg] += delta[seg] @ B[slot]^T. One
launch each for the whole batch, whatever mix of adapters it holds; a program computes one
[BLOCK_M, BLOCK_N] tile of one segment, reading only its slot's weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import dot_in_f32, interpreting
from radixlm.kernels.triton_ops.tiles import rows_times_wt


@triton.jit
def _sgmv_kernel(
    X,
    W,
    Y,
    seg_start,
    seg_len,
    seg_slot,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_ws,
    stride_wn,
    stride_wk,
    stride_ym,
    stride_yn,
    ADD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """Y[seg rows] (+)= X[seg rows] @ W[slot]^T for the segment of program 0's id."""
    seg = tl.program_id(0)
    slot = tl.load(seg_slot + seg).to(tl.int64)
    start = tl.load(seg_start + seg).to(tl.int64)
    length = tl.where(slot >= 0, tl.load(seg_len + seg), 0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = offs_m < length
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    rows = start + offs_m
    k_end = tl.where(
        tl.program_id(1) * BLOCK_M < length, K, 0
    )  # a tile past the segment reads nothing
    acc = rows_times_wt(
        X,
        rows,
        m_valid,
        stride_xm,
        stride_xk,
        W + tl.maximum(slot, 0) * stride_ws,
        offs_n,
        n_valid,
        stride_wn,
        stride_wk,
        K,
        k_end,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        F32_DOT,
    )
    ptrs = Y + rows[:, None] * stride_ym + offs_n[None, :] * stride_yn
    mask = m_valid[:, None] & n_valid[None, :]
    if ADD:
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, acc.to(Y.dtype.element_ty), mask=mask)


def _blocks() -> tuple[int, int, int, int]:
    return (16, 16, 32, 1) if interpreting() else (16, 64, 64, 4)


def sgmv(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    segments: torch.Tensor,
    max_len: int,
    add: bool,
) -> torch.Tensor:
    """x [T, K], w [slots, N, K], out [T, N]; segments [3, S] int64: (first row, rows, slot or -1)
    per segment; max_len: the longest segment (sizes the grid). out[seg] (+)= x[seg] @ w[slot]^T."""
    num_segments = segments.shape[1]
    if num_segments == 0 or max_len == 0:
        return out
    bm, bn, bk, warps = _blocks()
    n, k = w.shape[1], w.shape[2]
    grid = (num_segments, triton.cdiv(max_len, bm), triton.cdiv(n, bn))
    _sgmv_kernel[grid](
        x,
        w,
        out,
        segments[0],
        segments[1],
        segments[2],
        n,
        k,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        ADD=add,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        F32_DOT=dot_in_f32(x.dtype),
        num_warps=warps,
        num_stages=2,
    )
    return out


def lora_delta(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    segments: torch.Tensor,
    max_len: int,
) -> None:
    """out += (x @ A[slot]^T) @ B[slot]^T per segment (shrink, then expand); a [slots, R, K], b
    [slots, N, R]."""
    delta = torch.empty((x.shape[0], a.shape[1]), dtype=x.dtype, device=x.device)
    sgmv(x, a, delta, segments, max_len, add=False)
    sgmv(delta, b, out, segments, max_len, add=True)
