"""Extend (prefill) attention over the paged KV pool, in one launch per layer.

Every request of the batch has `prefix` tokens already in the pool (a radix-cache hit, earlier
chunks, a decode's context) and `ext` new ones, whose K/V RadixAttention has just stored. All of
them are read from the pool through the request's slot row (`kv_slots[b, pos]`, a copy of its
req_to_token row taken at launch), so a new token's key is exactly what later decode steps read,
whatever the pool's dtype. One program handles BLOCK_M queries of one head of one request
(flash attention: an online softmax over BLOCK_N keys at a time): the prefix keys are all
visible, the new ones causally. A MIXED batch's decodes are extends of one token; TARGET_VERIFY
is an extend too.

Options: a sliding window (keys at positions > p - window for a query at p), a logit soft-cap
(cap * tanh(s / cap) before the softmax), attention sinks (a logit per query head that joins the
softmax's denominator after the last tile, no value), and a custom mask over the new tokens (tree
verification: `custom_mask` holds, per request, an [ext, ext] row-major uint8 block starting at
`mask_start[b]`; 1 = the query attends that new token; the prefix stays fully visible and the mask
replaces causality within the extension).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import dot_in_f32, interpreting, next_pow2
from radixlm.kernels.triton_ops.tiles import add_sink, attend_tile


@triton.jit
def _extend_kernel(
    Q,
    K_buf,
    V_buf,
    O,
    kv_slots,
    stride_slots,
    qo_start,
    prefix_lens,
    extend_lens,
    custom_mask,
    mask_start,
    sm_scale,
    logit_cap,
    window,
    Sinks,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_CUSTOM_MASK: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    kvh = h // GROUP
    ext = tl.load(extend_lens + b).to(tl.int64)
    prefix = tl.load(prefix_lens + b).to(tl.int64)
    q0 = tl.load(qo_start + b).to(tl.int64)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < ext
    d_valid = offs_d < D
    q = tl.load(
        Q + (q0 + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=m_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    q_pos = prefix + offs_m

    # Keys [lo, hi): up to this block's last query (every new token under a custom mask); none
    # for a block past the request's queries.
    if USE_CUSTOM_MASK:
        hi = prefix + ext
    else:
        hi = tl.minimum(prefix + (mb + 1) * BLOCK_M, prefix + ext)
    lo = hi * 0
    if HAS_WINDOW:
        lo = tl.maximum(prefix + mb * BLOCK_M - window + 1, 0)
    hi = tl.where(mb * BLOCK_M < ext, hi, lo)

    m_i = tl.full(
        [BLOCK_M], -1e30, tl.float32
    )  # finite: a fully masked tile leaves the row as it was
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    slot_row = kv_slots + b * stride_slots
    if USE_CUSTOM_MASK:
        mask_row = custom_mask + tl.load(mask_start + b).to(tl.int64)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        slots = tl.load(slot_row + offs_n, mask=n_valid, other=0).to(tl.int64)
        if USE_CUSTOM_MASK:
            j = offs_n - prefix
            in_ext = j >= 0
            cm = tl.load(
                mask_row + offs_m[:, None] * ext + j[None, :],
                mask=m_valid[:, None] & in_ext[None, :] & n_valid[None, :],
                other=0,
            )
            visible = n_valid[None, :] & ((cm != 0) | (j[None, :] < 0))
        else:
            visible = n_valid[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        m_i, l_i, acc = attend_tile(
            q,
            K_buf,
            V_buf,
            slots,
            n_valid,
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
            HAS_CAP,
            F32_DOT,
        )
    if HAS_SINKS:
        m_i, l_i, acc = add_sink(Sinks, h, m_i, l_i, acc)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        O + (q0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=m_valid[:, None] & d_valid[None, :],
    )


def _blocks(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    if interpreting():
        return 16, 16, 1, 1
    if head_dim > 128:
        return 32, 32, 4, 2
    return 64, 64, 4, 2


def extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    kv_slots: torch.Tensor,
    qo_start: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    window: int | None = None,
    custom_mask: torch.Tensor | None = None,
    mask_start: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """q [T, H, D] (each request's new tokens, in batch order), k_buf / v_buf [slots, KVH, D] (the
    layer's pool buffers, the new tokens' K/V already stored), kv_slots [bs, >= max seq_len] slot
    rows, qo_start [bs] first row of each request in q, prefix_lens / extend_lens [bs];
    max_extend_len: the largest extend_lens (sizes the grid); sinks: float32 [H] or None -> out [T,
    H, D]."""
    bs = prefix_lens.shape[0]
    heads, d = q.shape[1], q.shape[2]
    kv_heads = k_buf.shape[1]
    if bs == 0 or max_extend_len == 0:
        return out
    bm, bn, warps, stages = _blocks(d)
    bm, bn = block_m or bm, block_n or bn
    use_mask = custom_mask is not None
    dummy = kv_slots  # stands in for the mask and sink pointers when there are none
    grid = (bs, heads, triton.cdiv(max_extend_len, bm))
    _extend_kernel[grid](
        q,
        k_buf,
        v_buf,
        out,
        kv_slots,
        kv_slots.stride(0),
        qo_start,
        prefix_lens,
        extend_lens,
        custom_mask if use_mask else dummy,
        mask_start if use_mask else dummy,
        float(sm_scale),
        float(logit_cap or 1.0),
        int(window or 0),
        dummy if sinks is None else sinks,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        GROUP=heads // kv_heads,
        D=d,
        BLOCK_D=max(16, next_pow2(d)),
        BLOCK_M=bm,
        BLOCK_N=bn,
        HAS_CAP=bool(logit_cap),
        HAS_WINDOW=window is not None,
        HAS_SINKS=sinks is not None,
        USE_CUSTOM_MASK=use_mask,
        F32_DOT=dot_in_f32(q.dtype),
        num_warps=warps,
        num_stages=stages,
    )
    return out
