"""Kimi Delta Attention's recurrence (LinearAttnBackend.kimi_delta_rule: torch's kda_rule.py and the
native kernel, kernels/csrc/kda.cpp) against a float64 reference: the rule written out token by
token here, on the same inputs and states. The Triton kernel runs the same checks in
tests/triton/test_linear_attn_kernels.py.

Batches mix decode with extends shorter and longer than a chunk (CHUNK = 32: 3, 32, 33, 100),
their state rows out of order and their states non-zero, inputs as strided views of one projection;
some channels decay fast (log decay down to -30 per token, as A_log = log 16 with a large gate
gives) so a chunk's cumulative decay underflows float32 if formed as a ratio of exponentials; a row
not in the batch must come back untouched. Prefills alone of several lengths, Kimi-Linear's head
size (128 x 128), and sizes off the native kernel's vectors (a key dim not a multiple of 8, a
partial block of value columns) too. The layer's other parts (conv, norms, gates) are checked end
to end against HF in tests/hybrid/test_kimi_linear.py.
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


def check_kda(backend, seq_lens, rows, device="cpu", seed=0, **kw):
    """backend.kimi_delta_rule on a kda_case against ref_kda: outputs, the batch's state rows, the
    other rows untouched."""
    case = kda_case(seed, seq_lens, **kw)
    rows = torch.tensor(rows)
    ref_o, ref_state = ref_kda(**case, rows=rows, seq_lens=seq_lens)
    dev = {n: t.to(device) for n, t in case.items()}
    o = backend.kimi_delta_rule(**dev, rows=rows.to(device), seq_lens=seq_lens)
    assert o.shape == case["v"].shape and o.dtype == case["v"].dtype
    assert_close(o.cpu(), ref_o, "kimi delta rule o")
    got = dev["ssm_state"].cpu()
    assert_state(got, ref_state, case["ssm_state"], rows, "kimi delta rule state")


@pytest.fixture(params=["torch", "native"])
def backend(request):
    if request.param == "torch":
        return TorchLinearAttnBackend()
    request.getfixturevalue("kernel_ops")  # the native kernels must build: a failure, not a skip
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    return NativeLinearAttnBackend()


@pytest.mark.parametrize("seq_lens,rows", [MIXED, DECODE], ids=["mixed", "decode"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_kimi_delta_rule(backend, seq_lens, rows, state_dtype):
    check_kda(backend, seq_lens, rows, state_dtype=state_dtype)


@pytest.mark.parametrize("n", [5, 2 * CHUNK, 2 * CHUNK + 7])
def test_a_prefill_alone(backend, n):
    check_kda(backend, [n], [6], seed=n)


def test_kimi_linear_head_size(backend):
    """Kimi-Linear-48B-A3B's heads (128 x 128: a whole vector block in place for a float32 decode
    step), decode and extends in one batch."""
    check_kda(backend, [1, 1, 9, CHUNK + 3], [4, 0, 8, 2], seed=7, h=2, dk=128, dv=128)


def test_sizes_off_the_vectors(backend):
    """A key dim not a multiple of 8 and value columns that end inside a block, float16 state."""
    check_kda(backend, [1, 4, 1, 40], [3, 1, 0, 8], seed=8, dk=12, dv=70, state_dtype=torch.float16)


def test_a_long_extend_equals_its_pieces(backend):
    """One 100-token extend leaves the state and outputs that 7 + 1 + 92 tokens in three calls
    leave (a prefill chunked, a snapshot taken inside it)."""
    case = kda_case(3, [100])
    whole = dict(case, ssm_state=case["ssm_state"].clone())
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


def test_native_states_interchange_with_torch(kernel_ops):
    """A state left by the native kernel continues under torch's rule and the other way round (the
    same layout): either order of the two backends over 40 + 1 + 30 tokens gives the reference."""
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    native, torch_ = NativeLinearAttnBackend(), TorchLinearAttnBackend()
    case = kda_case(9, [71])
    row = torch.tensor([2])
    ref_o, ref_state = ref_kda(**case, rows=row, seq_lens=[71])
    for order in ((native, torch_, native), (torch_, native, torch_)):
        state = case["ssm_state"].clone()
        parts = []
        for backend, (s, e) in zip(order, ((0, 40), (40, 41), (41, 71))):
            piece = {n: case[n][s:e] for n in ("q", "k", "v", "g", "beta")}
            parts.append(
                backend.kimi_delta_rule(**piece, ssm_state=state, rows=row, seq_lens=[e - s])
            )
        assert_close(torch.cat(parts), ref_o, "mixed backends' o")
        assert_close(state[2], ref_state[2], "mixed backends' state")


def test_native_isas_agree_bit_for_bit(kernel_ops):
    """The AVX-512 step (64 columns) runs lane for lane the AVX2 step's (32)."""
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    before = kernel_ops.linear_attn_isa()
    try:
        kernel_ops.linear_attn_isa("avx512")
    except RuntimeError:
        # A CPU without AVX-512: asking for it is refused and the AVX2 step stays the one run.
        assert before == kernel_ops.linear_attn_isa() == "avx2"
        return
    backend, rows = NativeLinearAttnBackend(), torch.tensor(MIXED[1])
    outs = []
    try:
        for isa in ("avx512", "avx2"):
            kernel_ops.linear_attn_isa(isa)
            case = kda_case(5, MIXED[0], dv=80)
            outs.append((backend.kimi_delta_rule(**case, rows=rows, seq_lens=MIXED[0]), case))
    finally:
        kernel_ops.linear_attn_isa(before)
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1]["ssm_state"], outs[1][1]["ssm_state"])


def test_native_refuses_bad_inputs(kernel_ops):
    case = kda_case(0, [2, 1])
    rows = torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match="out of range"):
        kernel_ops.kimi_delta_rule(**case, rows=torch.tensor([0, SLOTS]), seq_lens=[2, 1])
    with pytest.raises(RuntimeError, match="sum to"):
        kernel_ops.kimi_delta_rule(**case, rows=rows, seq_lens=[1, 1])
    with pytest.raises(RuntimeError, match="kimi_delta_rule g"):  # a scalar gate per head
        kernel_ops.kimi_delta_rule(**dict(case, g=case["g"][..., 0]), rows=rows, seq_lens=[2, 1])
    state = case["ssm_state"].transpose(2, 3).contiguous().transpose(2, 3)  # the right shape
    with pytest.raises(RuntimeError, match="kimi_delta_rule ssm_state: each slot must be contig"):
        kernel_ops.kimi_delta_rule(**dict(case, ssm_state=state), rows=rows, seq_lens=[2, 1])
