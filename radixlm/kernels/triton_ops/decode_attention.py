"""Decode attention over the paged KV pool with split-KV (flash-decoding), and a shared-prefix
stage.

One query per request. Stage 1 (`_decode_partial_kernel`) runs a program per (request, KV head,
split): the query heads sharing that KV head (GQA) are the rows of one tl.dot, so each K/V tile is
read once per KV head; a request's keys [kv_start, seq_len) are cut into `num_splits` ranges and
each program writes its partial output (softmax-normalized) and log-sum-exp. Stage 2
(`_decode_merge_kernel`) merges a request's partials by their log-sum-exp, and adds the head's
attention sink (if the layer has sinks) to the merged denominator. The grid depends on the
batch size alone (not on the lengths), so a CUDA graph captured for a batch size replays for any
lengths.

Shared prefixes (cascade attention, as the CPU backend's shared_prefix.py): requests that hold the
same leading KV slots (a radix-cache hit on one system prompt) form a group; `_decode_prefix_kernel`
runs a program per (group, KV head, split) whose rows are every member's query heads, so the
prefix's K/V are read once per group instead of once per request, and writes their partials into
the splits after the suffix's. The members' suffix programs start at the prefix's end (kv_start);
the merge takes both. The groups are found on the device (prefix_groups.py), so nothing here
waits for the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import dot_in_f32, interpreting, next_pow2
from radixlm.kernels.triton_ops.prefix_groups import PrefixGroups
from radixlm.kernels.triton_ops.tiles import attend_tile


@triton.jit
def _store_partial(
    Part_O,
    Part_L,
    rows_b,
    rows_h,
    split,
    row_valid,
    offs_d,
    d_valid,
    m_i,
    l_i,
    acc,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
):
    """A split's result per row: the normalized output and the log-sum-exp (-inf: no key)."""
    has = l_i > 0
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    base = rows_b * stride_pb + rows_h * stride_ph + split * stride_ps
    tl.store(
        Part_O + base[:, None] + offs_d[None, :], out, mask=row_valid[:, None] & d_valid[None, :]
    )
    tl.store(Part_L + rows_b * stride_lb + rows_h * stride_lh + split, lse, mask=row_valid)


@triton.jit
def _decode_partial_kernel(
    Q,
    K_buf,
    V_buf,
    Part_O,
    Part_L,
    kv_slots,
    stride_slots,
    kv_start,
    seq_lens,
    sm_scale,
    logit_cap,
    window,
    num_splits,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tl.arange(0, BLOCK_H)
    h_valid = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < D
    seq = tl.load(seq_lens + b).to(tl.int64)
    start = tl.load(kv_start + b).to(tl.int64)
    if HAS_WINDOW:
        start = tl.maximum(start, seq - window)
    per = tl.cdiv(tl.cdiv(seq - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * per
    hi = tl.minimum(lo + per, seq)
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=h_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    slot_row = kv_slots + b * stride_slots
    for pos in range(lo, hi, BLOCK_N):
        offs_n = pos + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        slots = tl.load(slot_row + offs_n, mask=n_valid, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(
            q,
            K_buf,
            V_buf,
            slots,
            n_valid,
            n_valid[None, :],
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
    rows_b = b + offs_h * 0
    _store_partial(
        Part_O,
        Part_L,
        rows_b,
        heads,
        split,
        h_valid,
        offs_d,
        d_valid,
        m_i,
        l_i,
        acc,
        stride_pb,
        stride_ph,
        stride_ps,
        stride_lb,
        stride_lh,
    )


@triton.jit
def _decode_prefix_kernel(
    Q,
    K_buf,
    V_buf,
    Part_O,
    Part_L,
    kv_slots,
    stride_slots,
    group_prefix,
    group_count,
    group_first,
    member_order,
    leaders,
    num_groups,
    sm_scale,
    logit_cap,
    num_prefix_splits,
    split_offset,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_CAP: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """Program (kv head, split): each group worth a pass (leaders[:num_groups]) over its split of
    the shared prefix, read from the leader's slot row; rows are (member, query head). Looping over
    the groups keeps the grid small: a batch without groups (most) pays programs that exit at
    once."""
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    MEMBERS: tl.constexpr = BLOCK_M // GROUP_P2
    r = tl.arange(0, BLOCK_M)
    member_local = r // GROUP_P2
    head_local = r % GROUP_P2
    heads = kvh * GROUP + head_local
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < D
    n_groups = tl.load(num_groups)
    for gi in range(0, n_groups):
        g = tl.load(leaders + gi).to(tl.int64)
        plen = tl.load(group_prefix + g).to(tl.int64)
        count = tl.load(group_count + g)
        first = tl.load(group_first + g)
        per = tl.cdiv(tl.cdiv(plen, num_prefix_splits), BLOCK_N) * BLOCK_N
        lo = split * per
        hi = tl.minimum(lo + per, plen)
        slot_row = kv_slots + g * stride_slots
        for mb in range(0, count, MEMBERS):
            idx = mb + member_local
            row_valid = (idx < count) & (head_local < GROUP)
            member = tl.load(member_order + first + idx, mask=row_valid, other=0).to(tl.int64)
            q = tl.load(
                Q + member[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None] & d_valid[None, :],
                other=0.0,
            )
            m_i = tl.full([BLOCK_M], -1e30, tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            for pos in range(lo, hi, BLOCK_N):
                offs_n = pos + tl.arange(0, BLOCK_N)
                n_valid = offs_n < hi
                slots = tl.load(slot_row + offs_n, mask=n_valid, other=0).to(tl.int64)
                m_i, l_i, acc = attend_tile(
                    q,
                    K_buf,
                    V_buf,
                    slots,
                    n_valid,
                    n_valid[None, :],
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
            _store_partial(
                Part_O,
                Part_L,
                member,
                heads,
                split_offset + split,
                row_valid,
                offs_d,
                d_valid,
                m_i,
                l_i,
                acc,
                stride_pb,
                stride_ph,
                stride_ps,
                stride_lb,
                stride_lh,
            )


@triton.jit
def _decode_merge_kernel(
    Part_O,
    Part_L,
    O,
    kv_start,
    Sinks,
    num_splits,
    num_prefix_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < D
    total = num_splits
    if HAS_PREFIX:  # a group member's prefix partials follow its own splits
        total = tl.where(tl.load(kv_start + b) > 0, num_splits + num_prefix_splits, num_splits)
    m = -1e30
    l_sum = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s in range(0, total):
        lse = tl.load(Part_L + b * stride_lb + h * stride_lh + s)
        o = tl.load(
            Part_O + b * stride_pb + h * stride_ph + s * stride_ps + offs_d, mask=d_valid, other=0.0
        )
        m_new = tl.maximum(m, lse)
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * alpha + w * o
        l_sum = l_sum * alpha + w
        m = m_new
    if HAS_SINKS:  # the sink's logit joins the denominator; it has no value
        sink = tl.load(Sinks + h).to(tl.float32)
        m_new = tl.maximum(m, sink)
        alpha = tl.exp(m - m_new)
        acc = acc * alpha
        l_sum = l_sum * alpha + tl.exp(sink - m_new)
    tl.store(
        O + b * stride_ob + h * stride_oh + offs_d,
        (acc / l_sum).to(O.dtype.element_ty),
        mask=d_valid,
    )


def _blocks() -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_M of the prefix stage, num_warps)."""
    return (16, 16, 1) if interpreting() else (64, 64, 4)


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    kv_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_start: torch.Tensor,
    num_splits: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    window: int | None = None,
    prefix: PrefixGroups | None = None,
    num_prefix_splits: int = 1,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 3,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [bs, H, D] over each request's keys at kv_slots[b, :seq_lens[b]] of k_buf / v_buf [slots,
    KVH, D] -> out [bs, H, D]. kv_start [bs]: where each request's own keys start (0, or its group's
    prefix length when `prefix` groups are given: their members read the prefix in the group pass).
    sinks: float32 [H] (the layer's attention sinks) or None.
    """
    bs, heads, d = q.shape
    if bs == 0:
        return out
    kv_heads = k_buf.shape[1]
    group = heads // kv_heads
    bn, bm, warps = _blocks()
    # block_n, num_warps, num_stages: tuning (benchmarks/gpu_attn_sweep.py). On an H200 at the 8B
    # shape, batch 64, 2,048 keys, three stages read the pool at 94% of the copy rate, two at 70%.
    bn, warps = block_n or bn, num_warps or warps
    block_d = max(16, next_pow2(d))
    total = num_splits + (num_prefix_splits if prefix is not None else 0)
    part_o = torch.empty((bs, heads, total, block_d), dtype=torch.float32, device=q.device)
    part_l = torch.empty((bs, heads, total), dtype=torch.float32, device=q.device)
    common = dict(
        D=d,
        BLOCK_D=block_d,
        BLOCK_N=bn,
        HAS_CAP=bool(logit_cap),
        F32_DOT=dot_in_f32(q.dtype),
        num_warps=warps,
    )
    strides = (
        q.stride(0),
        q.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_l.stride(0),
        part_l.stride(1),
    )
    cap = float(logit_cap or 1.0)
    _decode_partial_kernel[(bs, kv_heads, num_splits)](
        q,
        k_buf,
        v_buf,
        part_o,
        part_l,
        kv_slots,
        kv_slots.stride(0),
        kv_start,
        seq_lens,
        float(sm_scale),
        cap,
        int(window or 0),
        num_splits,
        *strides,
        GROUP=group,
        BLOCK_H=max(16, next_pow2(group)),
        HAS_WINDOW=window is not None,
        num_stages=num_stages,
        **common,
    )
    if prefix is not None:
        group_p2 = next_pow2(group)
        _decode_prefix_kernel[(kv_heads, num_prefix_splits)](
            q,
            k_buf,
            v_buf,
            part_o,
            part_l,
            kv_slots,
            kv_slots.stride(0),
            prefix.group_prefix,
            prefix.group_count,
            prefix.group_first,
            prefix.member_order,
            prefix.leaders,
            prefix.num_groups,
            float(sm_scale),
            cap,
            num_prefix_splits,
            num_splits,
            *strides,
            GROUP=group,
            GROUP_P2=group_p2,
            BLOCK_M=max(bm, 16, group_p2),
            num_stages=2,
            **common,
        )
    _decode_merge_kernel[(bs, heads)](
        part_o,
        part_l,
        out,
        kv_start,
        kv_start if sinks is None else sinks,  # kv_start: a pointer never read without sinks
        num_splits,
        num_prefix_splits,
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_l.stride(0),
        part_l.stride(1),
        out.stride(0),
        out.stride(1),
        D=d,
        BLOCK_D=block_d,
        HAS_PREFIX=prefix is not None,
        HAS_SINKS=sinks is not None,
        num_warps=1,
    )
    return out
