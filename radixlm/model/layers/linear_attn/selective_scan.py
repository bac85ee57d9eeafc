"""Mamba-1's selective scan in torch (MambaForCausalLM, FalconMambaForCausalLM, Jamba): a diagonal
state per channel d of N values, per token t:

    S[d] = exp(dt[t, d] * A[d]) * S[d] + dt[t, d] * x[t, d] * B[t]       A [D, N] < 0
    y[t, d] = S[d] . C[t]

(the D skip and the gate are the layer's). A decode step runs the one-token update for the whole
batch at once; an extend runs the recurrence per request, token by token over blocks whose decays
and inputs are formed at once. The torch backend's (LinearAttnBackend.selective_scan's default);
no native or Triton kernel yet.

Why not chunk-parallel: A is per channel and state (not one scalar per head as in Mamba-2), so a
chunk's intra-chunk decays are a [c, c, D, N] tensor: c times the recurrence's work. On CPU that
costs 5-100x the two in-place ops per token of the recurrence (measured at D 128-3072, N 16).
"""

from __future__ import annotations

import torch

# Tokens per block: its decays and states are [block, D, N] floats, at most BLOCK_ELEMS (1 MiB
# each: they stay in cache).
BLOCK = 64
BLOCK_ELEMS = 1 << 18
# A decay exp(dt A) under exp(-60) (< 1e-26) is taken as 0: exps and products that fall to
# subnormal floats run ~50x slower on x86, and a state's share that small is below float32's
# resolution beside the token's own input.
MIN_LOG_DECAY = -60.0


def _decay(dt: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """exp(dt[..., d] * A[d, n]) [..., D, N], flushed to 0 under exp(MIN_LOG_DECAY)."""
    log_decay = dt[..., None] * a
    return log_decay.clamp(min=MIN_LOG_DECAY).exp().masked_fill_(log_decay <= MIN_LOG_DECAY, 0)


def selective_scan_recurrent(x, dt, a, b, c, state):
    """x, dt [n, D], a [D, N], b, c [n, N] (float32 or float64); state [D, N] in their dtype,
    advanced in place. -> y [n, D]."""
    n, (d, s) = x.shape[0], a.shape
    block = max(1, min(BLOCK, BLOCK_ELEMS // (d * s)))
    out = torch.empty(n, d, dtype=x.dtype, device=x.device)
    for start in range(0, n, block):
        end = min(n, start + block)
        decay = _decay(dt[start:end], a)  # [k, D, N]
        states = (dt[start:end] * x[start:end])[:, :, None] * b[start:end, None, :]
        prev = state
        for t in range(end - start):
            states[t].addcmul_(prev, decay[t])  # S_t = exp(dt A) S_{t-1} + dt x B
            prev = states[t]
        state.copy_(prev)
        out[start:end] = torch.einsum("tdn,tn->td", states, c[start:end])
    return out


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
        state.mul_(_decay(dt, a)).add_((dt * xf)[:, :, None] * b[:, None, :])
        ssm_state[rows] = state.to(ssm_state.dtype)
        return torch.einsum("bdn,bn->bd", state, c).to(x.dtype)
    y = torch.empty_like(xf)
    for i, (s, e) in enumerate(_segments(seq_lens)):
        row = int(rows[i])
        state = ssm_state[row].to(f)
        y[s:e] = selective_scan_recurrent(xf[s:e], dt[s:e], a, b[s:e], c[s:e], state)
        ssm_state[row] = state.to(ssm_state.dtype)
    return y.to(x.dtype)
