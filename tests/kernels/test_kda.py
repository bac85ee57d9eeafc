"""Kimi Delta Attention's recurrence (LinearAttnBackend.kimi_delta_rule, kda_rule.py) against a
float64 reference: the rule written out token by token here, on the same inputs and states.

Batches mix decode with extends shorter and longer than a chunk (CHUNK = 32: 3, 32, 33, 100),
their state rows out of order, inputs as strided views of one projection; some channels decay
fast (log decay down to -30 per token, as A_log = log 16 with a large gate gives) so a chunk's
cumulative decay underflows float32 if formed as a ratio of exponentials; a row not in the batch
must come back untouched. The layer's other parts (conv, norms, gates) are checked end to end
against HF in tests/hybrid/test_kimi_linear.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.linear_attn.kda_rule import CHUNK
from radixlm.model.layers.linear_attn.torch_backend import TorchLinearAttnBackend
from tests.kernels.test_linear_attn import (
    SLOTS,
    assert_close,
    assert_state,
    fused_views,
    segments,
)

MIXED = ([1, 3, CHUNK, CHUNK + 1, 100], [5, 2, 7, 0, 3])
DECODE = ([1, 1, 1], [5, 2, 7])


def kda_case(seed, seq_lens, h=3, dk=16, dv=24, state_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = sum(seq_lens)
    q, k, v = fused_views(g, t, [h * dk, h * dk, h * dv])
    q = F.normalize(q.reshape(t, h, dk), dim=-1) * dk**-0.5
    k = F.normalize(k.reshape(t, h, dk), dim=-1)
    decay = -F.softplus(torch.randn(t, h, dk, generator=g))  # per channel, <= 0
    fast = torch.rand(t, h, dk, generator=g) < 0.2
    decay = torch.where(fast, decay * 15 - 1, decay)  # some channels forget within a token
    return dict(
        q=q,
        k=k,
        v=v.reshape(t, h, dv),
        g=decay,
        beta=torch.rand(t, h, generator=g),
        ssm_state=(torch.randn(SLOTS, h, dk, dv, generator=g) * 0.5).to(state_dtype),
    )


def ref_kda(q, k, v, g, beta, ssm_state, rows, seq_lens):
    """S = diag(exp(g_t)) S; S += k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t, per head, in
    float64."""
    state = ssm_state.double().clone()
    o = torch.empty(v.shape, dtype=torch.float64)
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    for (s, e), row in zip(segments(seq_lens), rows.tolist()):
        st = state[row]
        for t in range(s, e):
            for h in range(v.shape[1]):
                st[h] = g[t, h].exp()[:, None] * st[h]
                delta = beta[t, h] * (v[t, h] - st[h].T @ k[t, h])
                st[h] = st[h] + torch.outer(k[t, h], delta)
                o[t, h] = st[h].T @ q[t, h]
    return o, state


@pytest.mark.parametrize("seq_lens,rows", [MIXED, DECODE], ids=["mixed", "decode"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_kimi_delta_rule(seq_lens, rows, state_dtype):
    case = kda_case(0, seq_lens, state_dtype=state_dtype)
    rows = torch.tensor(rows)
    ref_o, ref_state = ref_kda(**case, rows=rows, seq_lens=seq_lens)
    before = case["ssm_state"].clone()
    o = TorchLinearAttnBackend().kimi_delta_rule(**case, rows=rows, seq_lens=seq_lens)
    assert o.shape == case["v"].shape and o.dtype == case["v"].dtype
    assert_close(o, ref_o, "kimi delta rule o")
    assert_state(case["ssm_state"], ref_state, before, rows, "kimi delta rule state")


def test_a_long_extend_equals_its_pieces():
    """One 100-token extend leaves the state and outputs that 7 + 1 + 92 tokens in three calls
    leave (a prefill chunked, a snapshot taken inside it)."""
    case = kda_case(3, [100])
    whole = dict(case, ssm_state=case["ssm_state"].clone())
    backend = TorchLinearAttnBackend()
    row = torch.tensor([4])
    o = backend.kimi_delta_rule(**whole, rows=row, seq_lens=[100])
    parts = []
    for s, e in ((0, 7), (7, 8), (8, 100)):
        piece = {n: case[n][s:e] for n in ("q", "k", "v", "g", "beta")}
        parts.append(
            backend.kimi_delta_rule(
                **piece, ssm_state=case["ssm_state"], rows=row, seq_lens=[e - s]
            )
        )
    assert_close(torch.cat(parts), o.double(), "pieces' o")
    assert_close(case["ssm_state"][4], whole["ssm_state"][4].double(), "pieces' state")
