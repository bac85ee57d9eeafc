"""The recurrences of hybrid models' state layers (model/layers/linear_attn/base.py states the math
and the layouts): the causal conv1d with its state, the gated delta rule, its form with a decay per
key channel (Kimi Delta Attention) and Mamba-2's SSD update, over a varlen batch (request i's tokens
[cu_seqlens[i], cu_seqlens[i + 1]), its state at rows[i]).

One kernel per operation serves decode and extend alike: a program owns one request's block of the
state (the conv's channel block; a delta rule head's block of value columns, which depend
only on their own columns of the state; an SSD head's block of rows), holds it in registers in
float32 while it walks the request's tokens in order, and stores it back once in the state's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton_ops import next_pow2


@triton.jit
def _history_or_x(X, state, start, f, valid, cols, cm, C, stride_xt, K: tl.constexpr):
    """Rows f of the request's [history; x] (f < K - 1: the history) in float32, 0 where not
    valid."""
    m = valid[:, None] & cm[None, :]
    from_x = m & (f >= K - 1)[:, None]
    xv = tl.load(X + (start + f - (K - 1))[:, None] * stride_xt + cols[None, :], from_x, other=0.0)
    hv = tl.load(state + f[:, None] * C + cols[None, :], m & (f < K - 1)[:, None], other=0.0)
    return xv.to(tl.float32) + hv.to(tl.float32)


@triton.jit
def _causal_conv1d_kernel(
    X,
    W,
    Bias,
    State,
    Y,
    Rows,
    Cu,
    C,
    stride_xt,
    stride_wc,
    stride_wk,
    stride_ss,
    stride_yt,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Program (request, channel block): y over the request's tokens in tiles of BLOCK_T; then the
    last K - 1 rows of [history; x] become the history."""
    r = tl.program_id(0)
    start = tl.load(Cu + r)
    n = tl.load(Cu + r + 1) - start
    state = State + tl.load(Rows + r) * stride_ss
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    if HAS_BIAS:
        bias = tl.load(Bias + cols, mask=cm, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    for t0 in range(0, n, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32) + bias[None, :]
        for j in tl.static_range(K):
            w = tl.load(W + cols * stride_wc + j * stride_wk, mask=cm, other=0.0).to(tl.float32)
            rows = _history_or_x(X, state, start, ts + j, ts < n, cols, cm, C, stride_xt, K)
            acc += w[None, :] * rows
        if SILU:
            acc = acc * tl.sigmoid(acc)
        out = (ts < n)[:, None] & cm[None, :]
        y = Y + (start + ts)[:, None] * stride_yt + cols[None, :]
        tl.store(y, acc.to(Y.dtype.element_ty), mask=out)
    i = tl.arange(0, BLOCK_H)
    new = _history_or_x(X, state, start, n + i, i < K - 1, cols, cm, C, stride_xt, K)
    # Every thread's reads of the old history happen before any thread overwrites it.
    tl.debug_barrier()
    hm = (i < K - 1)[:, None] & cm[None, :]
    tl.store(state + i[:, None] * C + cols[None, :], new.to(State.dtype.element_ty), mask=hm)


@triton.jit
def _gated_delta_rule_kernel(
    Q,
    K,
    V,
    G,
    Beta,
    State,
    O,
    Rows,
    Cu,
    Dk,
    Dv,
    group,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_gh,
    stride_bt,
    stride_bh,
    stride_ss,
    stride_sh,
    stride_ot,
    stride_oh,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Program (request, value head, block of value columns), per token:
    S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // group
    start = tl.load(Cu + r)
    end = tl.load(Cu + r + 1)
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    km = ks < Dk
    vm = vs < Dv
    sp = State + tl.load(Rows + r) * stride_ss + h * stride_sh + ks[:, None] * Dv + vs[None, :]
    sm = km[:, None] & vm[None, :]
    s = tl.load(sp, mask=sm, other=0.0).to(tl.float32)
    for t in range(start, end):
        q = tl.load(Q + t * stride_qt + hk * stride_qh + ks, mask=km, other=0.0).to(tl.float32)
        k = tl.load(K + t * stride_kt + hk * stride_kh + ks, mask=km, other=0.0).to(tl.float32)
        v = tl.load(V + t * stride_vt + h * stride_vh + vs, mask=vm, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(G + t * stride_gt + h * stride_gh).to(tl.float32))
        beta = tl.load(Beta + t * stride_bt + h * stride_bh).to(tl.float32)
        s = s * decay
        delta = (v - tl.sum(s * k[:, None], 0)) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], 0)
        tl.store(O + t * stride_ot + h * stride_oh + vs, o.to(O.dtype.element_ty), mask=vm)
    tl.store(sp, s.to(State.dtype.element_ty), mask=sm)


@triton.jit
def _kimi_delta_rule_kernel(
    Q,
    K,
    V,
    G,
    Beta,
    State,
    O,
    Rows,
    Cu,
    Dk,
    Dv,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_gh,
    stride_bt,
    stride_bh,
    stride_ss,
    stride_sh,
    stride_ot,
    stride_oh,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Program (request, head, block of value columns), per token, the gated delta rule with a
    decay per key channel (Kimi Delta Attention): S = diag(exp(g)) S;  S += k (beta (v - S^T
    k))^T;  o = S^T q."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.load(Cu + r)
    end = tl.load(Cu + r + 1)
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    km = ks < Dk
    vm = vs < Dv
    sp = State + tl.load(Rows + r) * stride_ss + h * stride_sh + ks[:, None] * Dv + vs[None, :]
    sm = km[:, None] & vm[None, :]
    s = tl.load(sp, mask=sm, other=0.0).to(tl.float32)
    for t in range(start, end):
        q = tl.load(Q + t * stride_qt + h * stride_qh + ks, mask=km, other=0.0).to(tl.float32)
        k = tl.load(K + t * stride_kt + h * stride_kh + ks, mask=km, other=0.0).to(tl.float32)
        v = tl.load(V + t * stride_vt + h * stride_vh + vs, mask=vm, other=0.0).to(tl.float32)
        g = tl.load(G + t * stride_gt + h * stride_gh + ks, mask=km, other=0.0).to(tl.float32)
        beta = tl.load(Beta + t * stride_bt + h * stride_bh).to(tl.float32)
        s = s * tl.exp(g)[:, None]
        delta = (v - tl.sum(s * k[:, None], 0)) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], 0)
        tl.store(O + t * stride_ot + h * stride_oh + vs, o.to(O.dtype.element_ty), mask=vm)
    tl.store(sp, s.to(State.dtype.element_ty), mask=sm)


@triton.jit
def _ssd_kernel(
    X,
    DT,
    A,
    B,
    Cm,
    State,
    Y,
    Rows,
    Cu,
    P,
    N,
    group,
    stride_xt,
    stride_xh,
    stride_dt,
    stride_dh,
    stride_bt,
    stride_bg,
    stride_ct,
    stride_cg,
    stride_ss,
    stride_sh,
    stride_yt,
    stride_yh,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (request, head, block of head_dim rows), per token:
    S = exp(dt a) S + (dt x) b^T;  y = S c."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    grp = h // group
    start = tl.load(Cu + r)
    end = tl.load(Cu + r + 1)
    ps = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    ns = tl.arange(0, BLOCK_N)
    pm = ps < P
    nm = ns < N
    sp = State + tl.load(Rows + r) * stride_ss + h * stride_sh + ps[:, None] * N + ns[None, :]
    sm = pm[:, None] & nm[None, :]
    s = tl.load(sp, mask=sm, other=0.0).to(tl.float32)
    a = tl.load(A + h).to(tl.float32)
    for t in range(start, end):
        dt = tl.load(DT + t * stride_dt + h * stride_dh).to(tl.float32)
        x = tl.load(X + t * stride_xt + h * stride_xh + ps, mask=pm, other=0.0).to(tl.float32)
        b = tl.load(B + t * stride_bt + grp * stride_bg + ns, mask=nm, other=0.0).to(tl.float32)
        c = tl.load(Cm + t * stride_ct + grp * stride_cg + ns, mask=nm, other=0.0).to(tl.float32)
        s = s * tl.exp(dt * a) + (dt * x)[:, None] * b[None, :]
        y = tl.sum(s * c[None, :], 1)
        tl.store(Y + t * stride_yt + h * stride_yh + ps, y.to(Y.dtype.element_ty), mask=pm)
    tl.store(sp, s.to(State.dtype.element_ty), mask=sm)


def _check_state(state: torch.Tensor, shape: tuple, what: str) -> None:
    if tuple(state.shape[1:]) != shape or not state[0].is_contiguous():
        raise ValueError(f"{what}: [slots, {', '.join(map(str, shape))}] with contiguous slots")


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def causal_conv1d(x, weight, bias, conv_state, rows, cu_seqlens, max_len: int, silu: bool):
    """x [T, C]; weight [C, K]; bias [C] or None; conv_state [slots, K - 1, C] (in place at rows);
    rows, cu_seqlens int64 on x's device; max_len: the longest request (sizes the token tile).
    -> y [T, C] in x's dtype."""
    x = _unit_last(x)
    t, c = x.shape
    k = weight.shape[1]
    _check_state(conv_state, (k - 1, c), "causal_conv1d conv_state")
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    bs = rows.shape[0]
    if bs == 0 or c == 0:
        return y
    block_c = min(128, next_pow2(c))
    grid = (bs, triton.cdiv(c, block_c))
    _causal_conv1d_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,
        conv_state,
        y,
        rows,
        cu_seqlens,
        c,
        x.stride(0),
        weight.stride(0),
        weight.stride(1),
        conv_state.stride(0),
        y.stride(0),
        K=k,
        HAS_BIAS=bias is not None,
        SILU=silu,
        BLOCK_T=min(16, next_pow2(max(max_len, 1))),
        BLOCK_C=block_c,
        BLOCK_H=next_pow2(k - 1),
        num_warps=4,
    )
    return y


def gated_delta_rule(q, k, v, g, beta, ssm_state, rows, cu_seqlens):
    """q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; ssm_state [slots, Hv, Dk, Dv] (in place
    at rows). -> o [T, Hv, Dv] in v's dtype."""
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    t, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    _check_state(ssm_state, (hv, dk, dv), "gated_delta_rule ssm_state")
    o = torch.empty(t, hv, dv, dtype=v.dtype, device=v.device)
    bs = rows.shape[0]
    if bs == 0:
        return o
    block_v = min(32, next_pow2(dv))
    _gated_delta_rule_kernel[(bs, hv, triton.cdiv(dv, block_v))](
        q,
        k,
        v,
        g,
        beta,
        ssm_state,
        o,
        rows,
        cu_seqlens,
        dk,
        dv,
        hv // hk,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        g.stride(1),
        beta.stride(0),
        beta.stride(1),
        ssm_state.stride(0),
        ssm_state.stride(1),
        o.stride(0),
        o.stride(1),
        BLOCK_K=next_pow2(dk),
        BLOCK_V=block_v,
        num_warps=4,
    )
    return o


def kimi_delta_rule(q, k, v, g, beta, ssm_state, rows, cu_seqlens):
    """q, k, g [T, H, Dk]; v [T, H, Dv]; beta [T, H]; ssm_state [slots, H, Dk, Dv] (in place at
    rows). -> o [T, H, Dv] in v's dtype."""
    q, k, v, g = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(g)
    t, h, dk = q.shape
    dv = v.shape[2]
    _check_state(ssm_state, (h, dk, dv), "kimi_delta_rule ssm_state")
    o = torch.empty(t, h, dv, dtype=v.dtype, device=v.device)
    bs = rows.shape[0]
    if bs == 0:
        return o
    block_v = min(32, next_pow2(dv))
    _kimi_delta_rule_kernel[(bs, h, triton.cdiv(dv, block_v))](
        q,
        k,
        v,
        g,
        beta,
        ssm_state,
        o,
        rows,
        cu_seqlens,
        dk,
        dv,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        g.stride(1),
        beta.stride(0),
        beta.stride(1),
        ssm_state.stride(0),
        ssm_state.stride(1),
        o.stride(0),
        o.stride(1),
        BLOCK_K=next_pow2(dk),
        BLOCK_V=block_v,
        num_warps=4,
    )
    return o


def ssd_update(x, dt, a, b, c, ssm_state, rows, cu_seqlens):
    """x [T, H, P]; dt [T, H]; a [H]; b, c [T, G, N]; ssm_state [slots, H, P, N] (in place at
    rows). -> y [T, H, P] in x's dtype."""
    x, b, c, a = _unit_last(x), _unit_last(b), _unit_last(c), a.contiguous()
    t, h, p = x.shape
    groups, n = b.shape[1], b.shape[2]
    _check_state(ssm_state, (h, p, n), "ssd_update ssm_state")
    y = torch.empty(t, h, p, dtype=x.dtype, device=x.device)
    bs = rows.shape[0]
    if bs == 0:
        return y
    block_p = min(16, next_pow2(p))
    _ssd_kernel[(bs, h, triton.cdiv(p, block_p))](
        x,
        dt,
        a,
        b,
        c,
        ssm_state,
        y,
        rows,
        cu_seqlens,
        p,
        n,
        h // groups,
        x.stride(0),
        x.stride(1),
        dt.stride(0),
        dt.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        ssm_state.stride(0),
        ssm_state.stride(1),
        y.stride(0),
        y.stride(1),
        BLOCK_P=block_p,
        BLOCK_N=next_pow2(n),
        num_warps=4,
    )
    return y
