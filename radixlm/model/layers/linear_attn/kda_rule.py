"""Kimi Delta Attention's recurrence in torch (Kimi-Linear): the gated delta rule with a decay per
key channel (a diagonal gate) instead of one scalar per head. Per token t and head h:

    S = diag(exp(g_t)) S                    g_t [Dk] <= 0: the channels' log decays
    S = S + k_t (beta_t (v_t - S^T k_t))^T
    o_t = S^T q_t

A decode step runs the one-token update for the whole batch at once; an extend runs
chunk-parallel per request (kda_chunked). The torch backend's (LinearAttnBackend.kimi_delta_rule's
default); native and triton run kernels of their own (kernels/csrc/kda.cpp,
kernels/triton_ops/linear_attn.py).
"""

from __future__ import annotations

import torch

# Tokens per chunk: the intra-chunk decays are materialized per channel, [H, c, c, Dk] floats.
CHUNK = 32


def kda_recurrent(q, k, v, g, beta, state):
    """Token by token: q, k, g [n, H, Dk], v [n, H, Dv], beta [n, H] (float32); state [H, Dk, Dv]
    float32, advanced in place. -> o [n, H, Dv] float32."""
    out = []
    for t in range(q.shape[0]):
        state.mul_(g[t].exp()[:, :, None])
        kv = torch.einsum("hkv,hk->hv", state, k[t])
        state.add_(k[t][:, :, None] * ((v[t] - kv) * beta[t][:, None])[:, None, :])
        out.append(torch.einsum("hkv,hk->hv", state, q[t]))
    return torch.stack(out)


def kda_chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The same as kda_recurrent, chunk-parallel. Inside a chunk, with cum the per-channel log
    decay from the chunk's start through each row, the deltas u solve
        (I + A) u = beta v - beta (k exp(cum)) S0
    with A[i, j] = beta_i sum_d k_i k_j exp(cum_i - cum_j) for j < i (one triangular solve);
    outputs and the next state follow in matmuls. The decays between rows are formed as
    exp(cum_i - cum_j) per channel (never exp(cum_i) / exp(cum_j): it overflows for channels that
    decay fast)."""
    n = q.shape[0]
    outs = []
    for s in range(0, n, chunk):
        qc, kc, vc, gc = (t[s : s + chunk].transpose(0, 1) for t in (q, k, v, g))  # [H, c, D]
        bc = beta[s : s + chunk].transpose(0, 1)  # [H, c]
        c = qc.shape[1]
        cum = gc.cumsum(1)  # [H, c, Dk]
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        diff = cum[:, :, None, :] - cum[:, None, :, :]  # [H, c, c, Dk]: rows i, j
        decay = torch.where(lower[:, :, None], diff, float("-inf")).exp()  # 0 where j > i
        kk = torch.einsum("hid,hjd,hijd->hij", kc, kc, decay)
        qk = torch.einsum("hid,hjd,hijd->hij", qc, kc, decay)
        strict = kk.tril(-1) * bc[:, :, None]
        eye = torch.eye(c, dtype=q.dtype, device=q.device).expand_as(strict)
        kb = kc * bc[..., None]
        rhs = torch.cat([vc * bc[..., None], kb * cum.exp()], dim=-1)
        solved = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
        u, w = solved.split([vc.shape[-1], kc.shape[-1]], dim=-1)
        v_new = u - w @ state  # [H, c, Dv]
        outs.append(((qc * cum.exp()) @ state + qk @ v_new).transpose(0, 1))
        last = cum[:, -1:, :]  # [H, 1, Dk]
        state.mul_(last.exp().transpose(1, 2)).add_(
            (kc * (last - cum).exp()).transpose(1, 2) @ v_new
        )
    return torch.cat(outs)


def kda_batch(q, k, v, g, beta, ssm_state, rows, seq_lens):
    """LinearAttnBackend.kimi_delta_rule in torch: each request's tokens from its state row."""
    qf, kf, vf, g, beta = q.float(), k.float(), v.float(), g.float(), beta.float()
    if all(n == 1 for n in seq_lens):  # a decode step: every request at once
        state = ssm_state[rows].float()  # [bs, H, Dk, Dv]
        state.mul_(g.exp()[..., None])
        kv = torch.einsum("bhkv,bhk->bhv", state, kf)
        state.add_(kf[..., None] * ((vf - kv) * beta[..., None])[..., None, :])
        ssm_state[rows] = state.to(ssm_state.dtype)
        return torch.einsum("bhkv,bhk->bhv", state, qf).to(v.dtype)
    o = torch.empty_like(vf)
    start = 0
    for i, n in enumerate(seq_lens):
        s, e = start, start + n
        start = e
        row = int(rows[i])
        state = ssm_state[row].float()
        fn = kda_recurrent if n == 1 else kda_chunked
        o[s:e] = fn(qf[s:e], kf[s:e], vf[s:e], g[s:e], beta[s:e], state)
        ssm_state[row] = state.to(ssm_state.dtype)
    return o.to(v.dtype)
