"""Fused MoE on the GPU: the (token, slot) pairs sorted by expert, then one grouped GEMM launch per
projection (SGLang's fused_moe_triton design: moe_align_block_size + the expert-blocked kernel).

`moe_align` pads each expert's pairs to a multiple of BLOCK_M and lists, per block of BLOCK_M
sorted pairs, the expert whose weights it multiplies by; a program of `_moe_gemm_kernel` computes
one [BLOCK_M, BLOCK_N] tile of one block, so every expert's weights are read once per N tile
whatever the routing, and experts no token chose are never read. Everything is sized by the
number of pairs and experts (the worst case of padding), never by the routing itself, so nothing
waits for the host and a CUDA graph can hold it. Ids of -1 (an expert another rank holds) are
left out; their rows stay zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import dot_in_f32, interpreting
from radixlm.kernels.triton_ops.tiles import rows_times_wt


@triton.jit
def _moe_gemm_kernel(
    A,
    W,
    C,
    sorted_pairs,
    block_expert,
    pair_weights,
    num_pairs,
    N,
    K,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    TOPK: tl.constexpr,
    A_PER_PAIR: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """C[pair, :] = A[row of pair] @ W[expert]^T (times the pair's routing weight)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert + pid_m).to(tl.int64)
    pairs = tl.load(sorted_pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_valid = pairs < tl.where(
        expert >= 0, num_pairs, 0
    )  # no row of a block past the last expert
    if A_PER_PAIR:
        rows = pairs
    else:
        rows = pairs // TOPK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    k_end = tl.where(expert >= 0, K, 0)  # a block past the last expert's pairs reads nothing
    acc = rows_times_wt(
        A,
        rows,
        row_valid,
        stride_am,
        stride_ak,
        W + tl.maximum(expert, 0) * stride_we,
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
    if MUL_WEIGHT:
        acc = acc * tl.load(pair_weights + pairs, mask=row_valid, other=0.0).to(tl.float32)[:, None]
    tl.store(
        C + pairs[:, None] * stride_cm + offs_n[None, :] * stride_cn,
        acc.to(C.dtype.element_ty),
        mask=row_valid[:, None] & n_valid[None, :],
    )


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted_pairs [blocks * block_m]: pair indices t * k + j grouped by
    expert, each expert's run padded to block_m with T * k; block_expert [blocks]: the expert of
    each block,
    -1 past the last)."""
    flat = topk_ids.reshape(-1)
    n = flat.numel()
    dev = flat.device
    ids = torch.where(
        flat < 0, torch.full_like(flat, num_experts), flat
    )  # -1: the left-out bucket E
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev).scatter_add_(
        0, ids, torch.ones_like(ids)
    )
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = torch.cat((torch.zeros(1, dtype=torch.int64, device=dev), ends[:-1]))
    order = torch.argsort(ids, stable=True)
    sorted_e = ids[order]
    rank = torch.arange(n, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    blocks = triton.cdiv(n + num_experts * (block_m - 1), block_m)
    length = blocks * block_m
    starts_ext = torch.cat(
        (starts, torch.full((1,), length, dtype=torch.int64, device=dev))
    )  # E -> the trash slot
    dest = torch.where(
        sorted_e < num_experts, starts_ext[sorted_e] + rank, torch.full_like(rank, length)
    )
    sorted_pairs = torch.full((length + 1,), n, dtype=torch.int64, device=dev)
    sorted_pairs.scatter_(0, dest, order)
    block_starts = torch.arange(blocks, device=dev) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    block_expert = torch.where(
        block_expert < num_experts, block_expert, torch.full_like(block_expert, -1)
    )
    return sorted_pairs[:length], block_expert


def _blocks(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)."""
    if interpreting():
        return 16, 32, 32, 1
    return 64, 64, 64, 4


def moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    sorted_pairs: torch.Tensor,
    block_expert: torch.Tensor,
    top_k: int,
    a_per_pair: bool,
    block_m: int,
    pair_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[pair] = a[pair's row] @ w[expert]^T (* pair_weights[pair]); w [E, N, K]."""
    num_pairs = out.shape[0]
    n, k = w.shape[1], w.shape[2]
    _, bn, bk, warps = _blocks(n, k)
    grid = (block_expert.shape[0], triton.cdiv(n, bn))
    _moe_gemm_kernel[grid](
        a,
        w,
        out,
        sorted_pairs,
        block_expert,
        pair_weights if pair_weights is not None else out,
        num_pairs,
        n,
        k,
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        TOPK=top_k,
        A_PER_PAIR=a_per_pair,
        MUL_WEIGHT=pair_weights is not None,
        BLOCK_M=block_m,
        BLOCK_N=bn,
        BLOCK_K=bk,
        F32_DOT=dot_in_f32(a.dtype),
        num_warps=warps,
        num_stages=2,
    )
    return out


def fused_experts_triton(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """hidden [T, H], topk_weights / topk_ids [T, k], w13 [E, 2I, H] ([gate; up]), w2 [E, H, I]
    (float, the hidden's dtype) -> [T, H]: sum over a token's slots of weight * down(silu(gate) *
    up)."""
    from radixlm.kernels.triton_ops.elementwise import TritonElementwiseOps

    t, top_k = topk_ids.shape
    num_experts, two_i = w13.shape[0], w13.shape[1]
    block_m = _blocks(two_i, hidden.shape[1])[0]
    sorted_pairs, block_expert = moe_align(topk_ids, num_experts, block_m)
    # Zeros: a pair left out (id -1) is never written, and its row then passes SiLU as zeros, not
    # garbage.
    gate_up = torch.zeros((t * top_k, two_i), dtype=hidden.dtype, device=hidden.device)
    moe_gemm(hidden, w13, gate_up, sorted_pairs, block_expert, top_k, False, block_m)
    act = TritonElementwiseOps.silu_and_mul(gate_up)
    down = torch.zeros((t * top_k, w2.shape[1]), dtype=hidden.dtype, device=hidden.device)
    moe_gemm(
        act,
        w2,
        down,
        sorted_pairs,
        block_expert,
        top_k,
        True,
        block_m,
        pair_weights=topk_weights.reshape(-1).float(),
    )
    return down.view(t, top_k, -1).sum(1)


def gateless_experts_triton(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    act,
) -> torch.Tensor:
    """Experts without a gate (Nemotron-H's: down(act(up x))): hidden [T, H], topk_weights /
    topk_ids [T, k], up [E, I, H], down [E, H, I] (float, the hidden's dtype), act an element-wise
    torch function (relu²) -> [T, H]. The grouped GEMM above, the activation between its two calls.
    """
    t, top_k = topk_ids.shape
    num_experts, inter = up.shape[0], up.shape[1]
    block_m = _blocks(inter, hidden.shape[1])[0]
    sorted_pairs, block_expert = moe_align(topk_ids, num_experts, block_m)
    h = torch.zeros((t * top_k, inter), dtype=hidden.dtype, device=hidden.device)
    moe_gemm(hidden, up, h, sorted_pairs, block_expert, top_k, False, block_m)
    out = torch.zeros((t * top_k, down.shape[1]), dtype=hidden.dtype, device=hidden.device)
    moe_gemm(
        act(h),
        down,
        out,
        sorted_pairs,
        block_expert,
        top_k,
        True,
        block_m,
        pair_weights=topk_weights.reshape(-1).float(),
    )
    return out.view(t, top_k, -1).sum(1)
