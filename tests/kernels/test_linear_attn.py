"""The linear-attention backends (model/layers/linear_attn/: torch, native) against a float64
reference: the torch backend's token-by-token recurrences (gdr_recurrent, ssd_recurrent) and the
conv written out, run in float64 on the same inputs and initial states.

Batches mix decode (seq_len 1) with extends shorter and longer than a chunk (3, 64, 65, 130), their
state rows out of order, key/value heads grouped (GVA) and SSD heads in groups, inputs as strided
views of one fused projection (as the model hands them over); a row not in the batch must come back
untouched. The helpers here are shared with tests/triton/test_linear_attn_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.linear_attn.torch_backend import (
    TorchLinearAttnBackend,
    gdr_recurrent,
    ssd_recurrent,
)

# float32 computation against float64: the recurrences are contractions (|decay| <= 1, normalized
# keys), so rounding stays near float32's epsilon times the values' size; a wrong index, decay or
# group is O(1).
RTOL = 2e-5
# A 16-bit state is rounded once per call: at most one unit in its last place (finfo.eps relative;
# Triton's interpreter truncates where the kernels round to nearest, within that).

MIXED = ([1, 3, 64, 65, 130], [5, 2, 7, 0, 3])
DECODE = ([1, 1, 1], [5, 2, 7])
SLOTS = 9


def segments(seq_lens):
    start = 0
    for n in seq_lens:
        yield start, start + n
        start += n


def fused_views(g, t, widths):
    """Column slices of one [t, sum(widths) + 5] tensor, strided as the model's split projection."""
    buf = torch.randn(t, sum(widths) + 5, generator=g)
    out, col = [], 2
    for w in widths:
        out.append(buf[:, col : col + w])
        col += w
    return out


def assert_close(got, ref, what, rtol=RTOL):
    scale = max(ref.abs().max().item(), 1.0)
    err = (got.double() - ref).abs().max().item()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} x {scale:.3g}"


def assert_state(got, ref, before, rows, what):
    """The rows in the batch against the reference (to float32 rounding, or one ulp of a 16-bit
    state), the others bit-identical to `before`."""
    rows = rows.tolist()
    others = [i for i in range(got.shape[0]) if i not in rows]
    assert torch.equal(got[others], before[others]), f"{what}: a row not in the batch changed"
    if got.dtype == torch.float32:
        assert_close(got[rows], ref[rows], what)
    else:
        err = (got[rows].double() - ref[rows]).abs()
        ulp = torch.finfo(got.dtype).eps
        bound = ulp * ref[rows].abs() + RTOL * max(ref[rows].abs().max().item(), 1.0)
        assert (err <= bound).all(), f"{what}: max error {err.max().item():.3g} past one ulp"


# ---- inputs and float64 references ---------------------------------------------------------------


def conv_case(seed, seq_lens, c=43, k=4, state_dtype=torch.float32, bias=True, weight_t=False):
    g = torch.Generator().manual_seed(seed)
    t = sum(seq_lens)
    (x,) = fused_views(g, t, [c])
    return dict(
        x=x,
        # weight_t: [C, K] as a view of a [K, C] tensor (the kernels take any strides)
        weight=(torch.randn(k, c, generator=g).t() if weight_t else torch.randn(c, k, generator=g)),
        bias=torch.randn(c, generator=g) if bias else None,
        conv_state=torch.randn(SLOTS, k - 1, c, generator=g).to(state_dtype),
    )


def ref_conv(x, weight, bias, conv_state, rows, seq_lens, activation):
    state = conv_state.double().clone()
    y = torch.empty(x.shape, dtype=torch.float64)
    k = weight.shape[1]
    for (s, e), row in zip(segments(seq_lens), rows.tolist()):
        full = torch.cat([state[row], x[s:e].double()])
        out = (full.unfold(0, k, 1) * weight.double()).sum(-1)
        if bias is not None:
            out = out + bias.double()
        y[s:e] = F.silu(out) if activation == "silu" else out
        state[row] = full[-(k - 1) :]
    return y, state


def gdr_case(seed, seq_lens, hk=2, hv=4, dk=32, dv=80, state_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = sum(seq_lens)
    q, k, v = fused_views(g, t, [hk * dk, hk * dk, hv * dv])
    q = F.normalize(q.view(t, hk, dk), dim=-1) * dk**-0.5
    k = F.normalize(k.view(t, hk, dk), dim=-1)
    return dict(
        q=q,
        k=k,
        v=v.view(t, hv, dv),
        g=-F.softplus(torch.randn(t, hv, generator=g)),  # log decay <= 0
        beta=torch.rand(t, hv, generator=g),
        ssm_state=(torch.randn(SLOTS, hv, dk, dv, generator=g) * 0.5).to(state_dtype),
    )


def ref_gdr(q, k, v, g, beta, ssm_state, rows, seq_lens):
    state = ssm_state.double().clone()
    rep = v.shape[1] // q.shape[1]
    o = torch.empty(v.shape, dtype=torch.float64)
    for (s, e), row in zip(segments(seq_lens), rows.tolist()):
        o[s:e] = gdr_recurrent(
            q[s:e].double().repeat_interleave(rep, 1),
            k[s:e].double().repeat_interleave(rep, 1),
            v[s:e].double(),
            g[s:e].double(),
            beta[s:e].double(),
            state[row],  # a view: advanced in place
        )
    return o, state


def ssd_case(seed, seq_lens, h=4, groups=2, p=20, n=24, state_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = sum(seq_lens)
    x, b, c = fused_views(g, t, [h * p, groups * n, groups * n])
    return dict(
        x=x.view(t, h, p),
        dt=F.softplus(torch.randn(t, h, generator=g) - 1.0),
        a=-torch.rand(h, generator=g) * 2 - 0.1,
        b=b.view(t, groups, n),
        c=c.view(t, groups, n),
        ssm_state=torch.randn(SLOTS, h, p, n, generator=g).to(state_dtype),
    )


def ref_ssd(x, dt, a, b, c, ssm_state, rows, seq_lens):
    state = ssm_state.double().clone()
    rep = x.shape[1] // b.shape[1]
    y = torch.empty(x.shape, dtype=torch.float64)
    for (s, e), row in zip(segments(seq_lens), rows.tolist()):
        y[s:e] = ssd_recurrent(
            x[s:e].double(),
            dt[s:e].double(),
            a.double(),
            b[s:e].double().repeat_interleave(rep, 1),
            c[s:e].double().repeat_interleave(rep, 1),
            state[row],
        )
    return y, state


# ---- the checks, for any backend -----------------------------------------------------------------


def _on(case, device):
    return {n: (t.to(device) if t is not None else None) for n, t in case.items()}


def check_conv(backend, seq_lens, rows, device="cpu", seed=0, **kw):
    activation = kw.pop("activation", "silu")
    case = conv_case(seed, seq_lens, **kw)
    rows = torch.tensor(rows)
    ref_y, ref_state = ref_conv(**case, rows=rows, seq_lens=seq_lens, activation=activation)
    dev = _on(case, device)
    y = backend.causal_conv1d(**dev, rows=rows.to(device), seq_lens=seq_lens, activation=activation)
    assert_close(y.cpu(), ref_y, "conv y")
    got = dev["conv_state"].cpu()
    assert_state(got, ref_state, case["conv_state"], rows, "conv_state")


def check_gdr(backend, seq_lens, rows, device="cpu", seed=1, **kw):
    case = gdr_case(seed, seq_lens, **kw)
    rows = torch.tensor(rows)
    ref_o, ref_state = ref_gdr(**case, rows=rows, seq_lens=seq_lens)
    dev = _on(case, device)
    o = backend.gated_delta_rule(**dev, rows=rows.to(device), seq_lens=seq_lens)
    assert o.shape == case["v"].shape and o.dtype == case["v"].dtype
    assert_close(o.cpu(), ref_o, "gated delta rule o")
    got = dev["ssm_state"].cpu()
    assert_state(got, ref_state, case["ssm_state"], rows, "gated delta rule state")


def check_ssd(backend, seq_lens, rows, device="cpu", seed=2, **kw):
    case = ssd_case(seed, seq_lens, **kw)
    rows = torch.tensor(rows)
    ref_y, ref_state = ref_ssd(**case, rows=rows, seq_lens=seq_lens)
    dev = _on(case, device)
    y = backend.ssd(**dev, rows=rows.to(device), seq_lens=seq_lens)
    assert y.shape == case["x"].shape
    assert_close(y.cpu(), ref_y, "ssd y")
    got = dev["ssm_state"].cpu()
    assert_state(got, ref_state, case["ssm_state"], rows, "ssd state")


# ---- torch and native ----------------------------------------------------------------------------


@pytest.fixture(params=["torch", "native"])
def backend(request):
    if request.param == "torch":
        return TorchLinearAttnBackend()
    request.getfixturevalue("kernel_ops")  # the native kernels must build: a failure, not a skip
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    return NativeLinearAttnBackend()


BATCHES = pytest.mark.parametrize("seq_lens,rows", [MIXED, DECODE], ids=["mixed", "decode"])
STATE_DTYPES = pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])


@BATCHES
@STATE_DTYPES
def test_causal_conv1d(backend, seq_lens, rows, state_dtype):
    check_conv(backend, seq_lens, rows, state_dtype=state_dtype)


@pytest.mark.parametrize("k,weight_t", [(2, False), (4, True), (4, False)])
def test_causal_conv1d_no_bias_no_activation(backend, k, weight_t):
    """Requests shorter than the history keep part of it; other kernel widths and weight layouts."""
    check_conv(backend, [2, 1, 9], [1, 8, 4], bias=False, activation=None, k=k, weight_t=weight_t)


@BATCHES
@STATE_DTYPES
def test_gated_delta_rule(backend, seq_lens, rows, state_dtype):
    check_gdr(backend, seq_lens, rows, state_dtype=state_dtype)


def test_gated_delta_rule_decode_whole_rows(backend):
    """A decode batch over float32 states whose value heads are a multiple of 128 wide takes
    128-column blocks (a head's whole rows) on AVX-512."""
    check_gdr(backend, [1, 1, 1, 1], [5, 2, 3, 7], dv=256)


@BATCHES
@STATE_DTYPES
def test_ssd(backend, seq_lens, rows, state_dtype):
    check_ssd(backend, seq_lens, rows, state_dtype=state_dtype)


def test_ssd_one_group_state_rows_off_the_vector_width(backend):
    check_ssd(backend, [2, 1, 70], [3, 4, 1], groups=1, p=8, n=20)


def test_causal_conv1d_float16_state(backend):
    check_conv(backend, [5, 1], [0, 6], state_dtype=torch.float16, c=24)


@pytest.mark.parametrize("lens,rows,dv", [(*MIXED, 80), (*DECODE, 256)], ids=["mixed", "decode"])
def test_native_isas_agree_bit_for_bit(kernel_ops, lens, rows, dv):
    """The gated delta rule's AVX-512 step (64 columns, 128 in a decode batch) runs lane for lane
    the AVX2 step's (32)."""
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    before = kernel_ops.linear_attn_isa()
    try:
        kernel_ops.linear_attn_isa("avx512")
    except RuntimeError:
        # A CPU without AVX-512: asking for it is refused and the AVX2 step stays the one run.
        assert before == kernel_ops.linear_attn_isa() == "avx2"
        return
    backend, rows = NativeLinearAttnBackend(), torch.tensor(rows)
    outs = []
    try:
        for isa in ("avx512", "avx2"):
            kernel_ops.linear_attn_isa(isa)
            case = gdr_case(5, lens, dv=dv)
            outs.append((backend.gated_delta_rule(**case, rows=rows, seq_lens=lens), case))
    finally:
        kernel_ops.linear_attn_isa(before)
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1]["ssm_state"], outs[1][1]["ssm_state"])


def test_native_refuses_bad_rows_and_lengths(kernel_ops):
    case = gdr_case(0, [2, 1])
    with pytest.raises(RuntimeError, match="out of range"):
        kernel_ops.gated_delta_rule(**case, rows=torch.tensor([0, SLOTS]), seq_lens=[2, 1])
    with pytest.raises(RuntimeError, match="sum to"):
        kernel_ops.gated_delta_rule(**case, rows=torch.tensor([0, 1]), seq_lens=[1, 1])


def test_auto_picks_native_on_cpu(kernel_ops):
    from radixlm.model.layers.linear_attn import create_linear_attn_backend

    assert create_linear_attn_backend("auto", torch.device("cpu")).name == "native"
    with pytest.raises(ValueError, match="CPU"):
        create_linear_attn_backend("native", torch.device("cuda"))


# ---- Gated DeltaNet's fused steps: gates, l2norms, tiled heads; the gated RMSNorm ----------

GATED_LENS, GATED_ROWS = [1, 70, 1, 3], [4, 0, 8, 2]


def gated_case(seed, seq_lens, hk=2, hv=4, dk=32, dv=80, state_dtype=torch.float32):
    """Raw inputs as the layer has them: q, k, v strided views of the conv's output, a and b of
    the in_proj_ba output."""
    g = torch.Generator().manual_seed(seed)
    t = sum(seq_lens)
    q, k, v = fused_views(g, t, [hk * dk, hk * dk, hv * dv])
    b, a = fused_views(g, t, [hv, hv])
    return dict(
        q=q.view(t, hk, dk) * 3,
        k=k.view(t, hk, dk),
        v=v.view(t, hv, dv),
        a=a * 2,
        b=b * 2,
        a_log=torch.randn(hv, generator=g),
        dt_bias=torch.randn(hv, generator=g),
        ssm_state=(torch.randn(SLOTS, hv, dk, dv, generator=g) * 0.5).to(state_dtype),
    )


def ref_gated(q, k, v, a, b, a_log, dt_bias, ssm_state, rows, seq_lens, tiled):
    def l2(x):
        x = x.double()
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    beta = b.double().sigmoid()
    g = -a_log.double().exp() * F.softplus(a.double() + dt_bias.double())
    q, k = l2(q) * q.shape[-1] ** -0.5, l2(k)
    if tiled:  # value head h reads key head h % Hk
        rep = v.shape[1] // q.shape[1]
        q, k = q.repeat(1, rep, 1), k.repeat(1, rep, 1)
    return ref_gdr(q, k, v, g, beta, ssm_state, rows, seq_lens)


@pytest.mark.parametrize("tiled", [False, True], ids=["grouped", "tiled"])
@STATE_DTYPES
def test_gated_delta_rule_gated(backend, tiled, state_dtype):
    case = gated_case(3, GATED_LENS, state_dtype=state_dtype)
    rows = torch.tensor(GATED_ROWS)
    ref_o, ref_state = ref_gated(**case, rows=rows, seq_lens=GATED_LENS, tiled=tiled)
    state = case["ssm_state"].clone()
    o = backend.gated_delta_rule_gated(
        **{**case, "ssm_state": state}, rows=rows, seq_lens=GATED_LENS, tiled=tiled
    )
    assert o.shape == case["v"].shape and o.dtype == case["v"].dtype
    assert_close(o, ref_o, "gated delta rule (gated) o")
    assert_state(state, ref_state, case["ssm_state"], rows, "gated delta rule (gated) state")


@pytest.mark.parametrize("tiled", [False, True], ids=["grouped", "tiled"])
def test_native_gated_matches_the_torch_default(kernel_ops, tiled):
    """The native fused op against the base class's torch steps on the same native rule."""
    from radixlm.model.layers.linear_attn.base import LinearAttnBackend
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    native, rows = NativeLinearAttnBackend(), torch.tensor(GATED_ROWS)
    case = gated_case(4, GATED_LENS, hk=2, hv=4)
    default = lambda **kw: LinearAttnBackend.gated_delta_rule_gated(native, **kw)
    outs = []
    for fn in (native.gated_delta_rule_gated, default):
        state = case["ssm_state"].clone()
        args = {**case, "ssm_state": state, "rows": rows, "seq_lens": GATED_LENS, "tiled": tiled}
        outs.append((fn(**args), state))
    assert_close(outs[0][0], outs[1][0].double(), "fused vs default o")
    assert_close(outs[0][1], outs[1][1].double(), "fused vs default state")


def ref_gated_rmsnorm(x, z, weight, eps):
    x, z = x.double(), z.double()
    return weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * F.silu(z)


@pytest.mark.parametrize("shape", [(5, 4, 80), (7, 36), (1, 16, 128)])
def test_gated_rmsnorm(backend, shape):
    g = torch.Generator().manual_seed(6)
    n, d = shape[0], shape[-1]
    width = shape[1] * d if len(shape) == 3 else d
    x, z = fused_views(g, n, [width, width])  # strided, as z is from the fused projection
    x, z = x.reshape(shape), z.view(shape) * 4
    weight = torch.randn(d, generator=g)
    y = backend.gated_rmsnorm(x, z, weight, 1e-6)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert_close(y, ref_gated_rmsnorm(x, z, weight, 1e-6), "gated rmsnorm")


def test_native_gated_rmsnorm_other_dtypes_take_the_default(kernel_ops):
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    g = torch.Generator().manual_seed(7)
    x, z = (torch.randn(3, 2, 64, generator=g).bfloat16() for _ in range(2))
    weight = torch.randn(64, generator=g)
    y = NativeLinearAttnBackend().gated_rmsnorm(x, z, weight, 1e-6)
    assert torch.equal(y, TorchLinearAttnBackend().gated_rmsnorm(x, z, weight, 1e-6))
