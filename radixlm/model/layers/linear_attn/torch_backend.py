"""The recurrences in torch (any device; the fallback and the readable statement of the math).

A request's extend runs chunk-parallel (the WY form of the gated delta rule, the SSD form of
Mamba-2: matmuls over chunks of CHUNK tokens, one small triangular solve per chunk); a decode step
runs the one-token update for the whole batch at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.model.layers.linear_attn.base import LinearAttnBackend

CHUNK = 64


def _segments(seq_lens: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in seq_lens:
        out.append((start, start + n))
        start += n
    return out


def conv1d_one(
    x: torch.Tensor, weight: torch.Tensor, bias, history: torch.Tensor, activation
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: x [n, C] after history [K - 1, C] -> (y [n, C], the new history)."""
    k = weight.shape[1]
    full = torch.cat([history.to(torch.float32), x.to(torch.float32)])  # [K - 1 + n, C]
    windows = full.unfold(0, k, 1)  # [n, C, K]
    y = (windows * weight.to(torch.float32)).sum(-1)
    if bias is not None:
        y = y + bias.to(torch.float32)
    if activation == "silu":
        y = F.silu(y)
    return y.to(x.dtype), full[-(k - 1) :]


def gdr_recurrent(q, k, v, g, beta, state):
    """Token by token, [n, H, D] inputs with key heads already repeated; state [H, Dk, Dv]
    float32, advanced in place. -> o [n, H, Dv] float32."""
    out = []
    for t in range(q.shape[0]):
        state.mul_(g[t].exp()[:, None, None])
        kv = torch.einsum("hkv,hk->hv", state, k[t])
        delta = (v[t] - kv) * beta[t][:, None]
        state.add_(k[t][:, :, None] * delta[:, None, :])
        out.append(torch.einsum("hkv,hk->hv", state, q[t]))
    return torch.stack(out)


def gdr_chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The same as gdr_recurrent, chunk-parallel: inside a chunk the delta rule's updates are
    folded into T = (I + L)^-1 (L: the strictly lower k_beta k^T with the decays between rows), so
    a chunk costs a few matmuls and one triangular solve."""
    n = q.shape[0]
    outs = []
    for s in range(0, n, chunk):
        qc, kc, vc = (t[s : s + chunk].transpose(0, 1) for t in (q, k, v))  # [H, c, D]
        gc, bc = g[s : s + chunk].transpose(0, 1), beta[s : s + chunk].transpose(0, 1)  # [H, c]
        c = qc.shape[1]
        cum = gc.cumsum(-1)  # [H, c]: log decay from the chunk's start through row i
        diff = cum[:, :, None] - cum[:, None, :]  # [H, c, c]: decay between rows j < i
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        decay = torch.where(lower, diff, float("-inf")).exp()  # 0 above the diagonal
        kb = kc * bc[..., None]
        strict = (kb @ kc.transpose(1, 2)) * decay.tril(-1)
        eye = torch.eye(c, dtype=q.dtype, device=q.device).expand_as(strict)
        rhs = torch.cat([vc * bc[..., None], kb * cum.exp()[..., None]], dim=-1)
        solved = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
        u, w = solved.split([vc.shape[-1], kc.shape[-1]], dim=-1)
        v_new = u - w @ state  # [H, c, Dv]: each row's delta after the state entering the chunk
        o = (qc * cum.exp()[..., None]) @ state + ((qc @ kc.transpose(1, 2)) * decay) @ v_new
        outs.append(o.transpose(0, 1))
        last = cum[:, -1:]  # [H, 1]
        state.mul_(last.exp()[..., None]).add_(
            (kc * (last - cum).exp()[..., None]).transpose(1, 2) @ v_new
        )
    return torch.cat(outs)


def ssd_recurrent(x, dt, a, b, c, state):
    """Mamba-2 token by token: x [n, H, P], dt [n, H], a [H], b/c [n, H, N] (groups already
    repeated), state [H, P, N] float32 in place. -> y [n, H, P] float32."""
    out = []
    for t in range(x.shape[0]):
        state.mul_((dt[t] * a).exp()[:, None, None])
        state.add_((dt[t][:, None] * x[t])[:, :, None] * b[t][:, None, :])
        out.append(torch.einsum("hpn,hn->hp", state, c[t]))
    return torch.stack(out)


def ssd_chunked(x, dt, a, b, c, state, chunk: int = CHUNK):
    """The same as ssd_recurrent, chunk-parallel (Mamba-2's SSD: within a chunk the output is a
    masked, decayed attention of c over b; across chunks the state carries)."""
    n = x.shape[0]
    outs = []
    for s in range(0, n, chunk):
        xc, bc, cc = (t[s : s + chunk].transpose(0, 1) for t in (x, b, c))  # [H, c, *]
        dtc = dt[s : s + chunk].transpose(0, 1)  # [H, c]
        cum = (dtc * a[:, None]).cumsum(-1)  # [H, c]
        length = cum.shape[1]
        lower = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        decay = torch.where(lower, cum[:, :, None] - cum[:, None, :], float("-inf")).exp()
        scores = (cc @ bc.transpose(1, 2)) * decay * dtc[:, None, :]  # [H, c, c]
        y = scores @ xc + (cc @ state.transpose(1, 2)) * cum.exp()[..., None]
        outs.append(y.transpose(0, 1))
        last = cum[:, -1:]
        weights = ((last - cum).exp() * dtc)[..., None]  # [H, c, 1]
        state.mul_(last.exp()[..., None]).add_((xc * weights).transpose(1, 2) @ bc)
    return torch.cat(outs)


def _repeat_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[n, G, D] -> [n, heads, D]: consecutive heads share a group (repeat_interleave)."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


class TorchLinearAttnBackend(LinearAttnBackend):
    name = "torch"

    def causal_conv1d(self, x, weight, bias, conv_state, rows, seq_lens, activation):
        y = torch.empty_like(x)
        for i, (s, e) in enumerate(_segments(seq_lens)):
            row = int(rows[i])
            y[s:e], history = conv1d_one(x[s:e], weight, bias, conv_state[row], activation)
            conv_state[row] = history.to(conv_state.dtype)
        return y

    def gated_delta_rule(self, q, k, v, g, beta, ssm_state, rows, seq_lens):
        heads = v.shape[1]
        q, k = _repeat_heads(q, heads).float(), _repeat_heads(k, heads).float()
        vf, g, beta = v.float(), g.float(), beta.float()
        if all(n == 1 for n in seq_lens):  # a decode step: every request at once
            state = ssm_state[rows].float()  # [bs, H, Dk, Dv]
            state.mul_(g.exp()[..., None, None])
            kv = torch.einsum("bhkv,bhk->bhv", state, k)
            state.add_(k[..., None] * ((vf - kv) * beta[..., None])[..., None, :])
            ssm_state[rows] = state.to(ssm_state.dtype)
            return torch.einsum("bhkv,bhk->bhv", state, q).to(v.dtype)
        o = torch.empty_like(vf)
        for i, (s, e) in enumerate(_segments(seq_lens)):
            row = int(rows[i])
            state = ssm_state[row].float()
            fn = gdr_recurrent if e - s == 1 else gdr_chunked
            o[s:e] = fn(q[s:e], k[s:e], vf[s:e], g[s:e], beta[s:e], state)
            ssm_state[row] = state.to(ssm_state.dtype)
        return o.to(v.dtype)

    def ssd(self, x, dt, a, b, c, ssm_state, rows, seq_lens):
        heads = x.shape[1]
        b, c = _repeat_heads(b, heads).float(), _repeat_heads(c, heads).float()
        xf, dt, a = x.float(), dt.float(), a.float()
        y = torch.empty_like(xf)
        for i, (s, e) in enumerate(_segments(seq_lens)):
            row = int(rows[i])
            state = ssm_state[row].float()
            fn = ssd_recurrent if e - s == 1 else ssd_chunked
            y[s:e] = fn(xf[s:e], dt[s:e], a, b[s:e], c[s:e], state)
            ssm_state[row] = state.to(ssm_state.dtype)
        return y.to(x.dtype)
