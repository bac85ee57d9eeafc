"""The decoder's element-wise ops as one kernel each: RMSNorm (with the residual add fused), RoPE on
q and k in place, SiLU(gate) * up, and the KV store (K and V of the new tokens written at their
slots, converted to the pool's dtype, in one launch).

Each rounds where the torch code it replaces rounds (model/layers/norm.py, rotary.py,
activation.py): the statistics in float32, the normalized value cast to the model dtype before the
weight multiplies it, the sum with the residual cast before it is normalized, SiLU cast before the
product. `TritonElementwiseOps` carries them under the native CPU ops' names (kernels/ops.py), so a
layer calls either the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import next_pow2


@triton.jit
def _rmsnorm_kernel(
    X,
    R,
    W,
    Y,
    stride_x,
    stride_r,
    stride_y,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    ADD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < N
    x = tl.load(X + row * stride_x + offs, mask=valid, other=0.0)
    if ADD:  # residual <- x + residual (in the model dtype); x <- norm(residual)
        x = x.to(tl.float32) + tl.load(R + row * stride_r + offs, mask=valid, other=0.0).to(
            tl.float32
        )
        x = x.to(R.dtype.element_ty)
        tl.store(R + row * stride_r + offs, x, mask=valid)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    normed = (xf * rstd).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + offs, mask=valid, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + offs, (normed * w).to(Y.dtype.element_ty), mask=valid)


@triton.jit
def _silu_and_mul_kernel(X, Y, stride_x, stride_y, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < N
    g = tl.load(X + row * stride_x + offs, mask=valid, other=0.0).to(tl.float32)
    u = tl.load(X + row * stride_x + N + offs, mask=valid, other=0.0).to(tl.float32)
    silu = (g * tl.sigmoid(g)).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * stride_y + offs, (silu * u).to(Y.dtype.element_ty), mask=valid)


@triton.jit
def _rotate_heads(
    base, stride, n, t, heads, offs, valid, cos, sin, HEAD_DIM: tl.constexpr, HALF: tl.constexpr
):
    c = cos.to(base.dtype.element_ty).to(tl.float32)  # the torch path's cos/sin in the model dtype
    s = sin.to(base.dtype.element_ty).to(tl.float32)
    m = (heads[:, None] < n) & valid[None, :]
    ptr = base + t * stride + heads[:, None] * HEAD_DIM + offs[None, :]
    x1 = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(ptr, (x1 * c[None, :] - x2 * s[None, :]).to(base.dtype.element_ty), mask=m)
    tl.store(ptr + HALF, (x2 * c[None, :] + x1 * s[None, :]).to(base.dtype.element_ty), mask=m)


@triton.jit
def _rotary_kernel(
    Pos,
    Q,
    K,
    CosSin,
    stride_q,
    stride_k,
    stride_cs,
    num_q_heads,
    num_k_heads,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Program (token, head block): rotate the first 2 * HALF dims of each head of q and k (neox
    halves)."""
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pos = tl.load(Pos + t).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    valid = offs < HALF
    cos = tl.load(CosSin + pos * stride_cs + offs, mask=valid, other=0.0)
    sin = tl.load(CosSin + pos * stride_cs + HALF + offs, mask=valid, other=0.0)
    _rotate_heads(Q, stride_q, num_q_heads, t, heads, offs, valid, cos, sin, HEAD_DIM, HALF)
    _rotate_heads(K, stride_k, num_k_heads, t, heads, offs, valid, cos, sin, HEAD_DIM, HALF)


@triton.jit
def _kv_store_kernel(
    K,
    V,
    Loc,
    KB,
    VB,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Loc + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    m = (h[:, None] < HEADS) & (d[None, :] < D)
    k = tl.load(K + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=m, other=0.0)
    v = tl.load(V + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=m, other=0.0)
    tl.store(
        KB + slot * stride_kbs + h[:, None] * stride_kbh + d[None, :],
        k.to(KB.dtype.element_ty),
        mask=m,
    )
    tl.store(
        VB + slot * stride_vbs + h[:, None] * stride_vbh + d[None, :],
        v.to(VB.dtype.element_ty),
        mask=m,
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a unit stride in the last dim (a view when it already has one)."""
    return x if x.stride(-1) == 1 else x.contiguous()


class TritonElementwiseOps:
    """The Triton kernels under the names of the native CPU ops (torch.ops.radixlm), for 2-D
    inputs."""

    @staticmethod
    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = _rows(x)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n = x.shape[-1]
        if x.shape[0]:
            _rmsnorm_kernel[(x.shape[0],)](
                x,
                x,
                weight,
                y,
                x.stride(0),
                x.stride(0),
                y.stride(0),
                float(eps),
                N=n,
                BLOCK=next_pow2(n),
                ADD=False,
                num_warps=_warps(n),
            )
        return y

    @staticmethod
    def add_rmsnorm_(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> None:
        """residual += x; x = rmsnorm(residual) (both in place, rows with a unit last stride)."""
        n = x.shape[-1]
        if x.shape[0]:
            _rmsnorm_kernel[(x.shape[0],)](
                x,
                residual,
                weight,
                x,
                x.stride(0),
                residual.stride(0),
                x.stride(0),
                float(eps),
                N=n,
                BLOCK=next_pow2(n),
                ADD=True,
                num_warps=_warps(n),
            )

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        x = _rows(x)
        n = x.shape[-1] // 2
        y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
        block = min(1024, next_pow2(n))
        if x.shape[0]:
            _silu_and_mul_kernel[(x.shape[0], triton.cdiv(n, block))](
                x, y, x.stride(0), y.stride(0), N=n, BLOCK=block, num_warps=4
            )
        return y

    @staticmethod
    def rotary_embedding_(
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        head_dim: int,
        cos_sin_cache: torch.Tensor,
    ) -> None:
        """q [T, Hq * head_dim], k [T, Hk * head_dim] (rows with a unit last stride), rotated in
        place at `positions` by cos_sin_cache [max_pos, rotary_dim] (cos | sin)."""
        t = q.shape[0]
        half = cos_sin_cache.shape[1] // 2
        hq, hk = q.shape[1] // head_dim, k.shape[1] // head_dim
        block_h = min(16, next_pow2(max(hq, hk)))
        if t:
            _rotary_kernel[(t, triton.cdiv(max(hq, hk), block_h))](
                positions,
                q,
                k,
                cos_sin_cache,
                q.stride(0),
                k.stride(0),
                cos_sin_cache.stride(0),
                hq,
                hk,
                HEAD_DIM=head_dim,
                HALF=half,
                BLOCK_HALF=next_pow2(half),
                BLOCK_H=block_h,
                num_warps=4,
            )

    @staticmethod
    def kv_store_(
        k: torch.Tensor,
        v: torch.Tensor,
        loc: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        k_scale=None,
        v_scale=None,
    ) -> None:
        """k, v [T, heads, D] (any token / head strides, unit last stride) stored at slots loc of
        k_buf / v_buf [slots, heads, D], converted to their dtype (float pools: no scales)."""
        assert k_scale is None and v_scale is None, "the Triton KV store writes float pools"
        t, heads, d = k.shape
        if t:
            _kv_store_kernel[(t,)](
                k,
                v,
                loc,
                k_buf,
                v_buf,
                k.stride(0),
                k.stride(1),
                v.stride(0),
                v.stride(1),
                k_buf.stride(0),
                k_buf.stride(1),
                v_buf.stride(0),
                v_buf.stride(1),
                HEADS=heads,
                D=d,
                BLOCK_H=next_pow2(heads),
                BLOCK_D=next_pow2(d),
                num_warps=4,
            )


def _warps(n: int) -> int:
    return 8 if n >= 4096 else 4
