"""Mamba-1's selective scan in torch (MambaForCausalLM, FalconMambaForCausalLM, Jamba): a diagonal
state per channel d of N values, per token t:

    S[d] = exp(dt[t, d] * A[d]) * S[d] + dt[t, d] * x[t, d] * B[t]       A [D, N] < 0
    y[t, d] = S[d] . C[t]

(the D skip and the gate are the layer's). A decode step runs the one-token update for the whole
batch at once; an extend runs chunk-parallel per request (selective_scan_chunked). The torch
backend's (LinearAttnBackend.selective_scan's default); no native or Triton kernel yet.
"""

from __future__ import annotations

import torch

# Tokens per chunk: the intra-chunk decays are materialized per channel and state, [c, c, D, N]
# floats at most CHUNK_ELEMS of them (a shorter chunk for wide layers).
CHUNK = 32
CHUNK_ELEMS = 1 << 24


def selective_scan_recurrent(x, dt, a, b, c, state):
    """Token by token: x, dt [n, D], a [D, N], b, c [n, N] (float32); state [D, N] float32,
    advanced in place. -> y [n, D] float32."""
    out = []
    for t in range(x.shape[0]):
        state.mul_((dt[t, :, None] * a).exp()).add_((dt[t] * x[t])[:, None] * b[t][None, :])
        out.append(state @ c[t])
    return torch.stack(out)


def selective_scan_chunked(x, dt, a, b, c, state):
    """The same as selective_scan_recurrent, chunk-parallel: inside a chunk, with cum[t] the log
    decay from the chunk's start through token t (per channel and state), token t reads token
    s <= t's input decayed by exp(cum[t] - cum[s]) (formed as a difference: never a ratio of
    exponentials, which overflows) and the state entering the chunk decayed by exp(cum[t])."""
    d, n = a.shape
    chunk = max(1, min(CHUNK, int((CHUNK_ELEMS // (d * n)) ** 0.5)))
    outs = []
    for s in range(0, x.shape[0], chunk):
        xc, dtc, bc, cc = (t[s : s + chunk] for t in (x, dt, b, c))
        length = xc.shape[0]
        cum = (dtc[:, :, None] * a).cumsum(0)  # [c, D, N]
        lower = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        diff = cum[:, None] - cum[None, :]  # [t, s, D, N]
        decay = torch.where(lower[:, :, None, None], diff, float("-inf")).exp()
        u = (dtc * xc)[:, :, None] * bc[:, None, :]  # [s, D, N]: each token's input to the state
        states = torch.einsum("tsdn,sdn->tdn", decay, u) + cum.exp() * state
        outs.append(torch.einsum("tdn,tn->td", states, cc))
        state.copy_(states[-1])
    return torch.cat(outs)


def _segments(seq_lens: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in seq_lens:
        out.append((start, start + n))
        start += n
    return out


def selective_scan_batch(x, dt, a, b, c, ssm_state, rows, seq_lens):
    """LinearAttnBackend.selective_scan in torch (its arguments)."""
    f = torch.promote_types(x.dtype, torch.float32)  # float32 at least (float64 stays)
    xf, dt, a, b, c = (t.to(f) for t in (x, dt, a, b, c))
    if all(n == 1 for n in seq_lens):  # a decode step: every request at once
        state = ssm_state[rows].to(f)  # [bs, D, N]
        state.mul_((dt[:, :, None] * a).exp()).add_((dt * xf)[:, :, None] * b[:, None, :])
        ssm_state[rows] = state.to(ssm_state.dtype)
        return torch.einsum("bdn,bn->bd", state, c).to(x.dtype)
    y = torch.empty_like(xf)
    for i, (s, e) in enumerate(_segments(seq_lens)):
        row = int(rows[i])
        state = ssm_state[row].to(f)
        fn = selective_scan_recurrent if e - s == 1 else selective_scan_chunked
        y[s:e] = fn(xf[s:e], dt[s:e], a, b[s:e], c[s:e], state)
        ssm_state[row] = state.to(ssm_state.dtype)
    return y.to(x.dtype)
