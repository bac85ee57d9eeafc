"""The native fused MoE op (torch.ops.radixlm.fused_moe, csrc/moe.cpp) in every weight format the
dense kernels read, row-major and 8-row interleaved, on ragged routings.

References: (1) fused_experts_torch on the same quantized weights: the same kernels, SiLU and
slot-order sum, so the op must equal it bitwise; (2) a float64 loop over (token, slot) on the
dequantized weights, within a bound made of the int8 activation grids (x for gate/up, the SiLU
output for down, half a step per value, propagated) plus float32 rounding. Then batch invariance
(a token's row alone, in another batch, on one thread: bitwise), and at T = 1 the op reads only the
chosen experts' bytes (the others' pages are made unreadable: a read would kill the process)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.formats import FLOAT16, FLOAT_ACTIVATIONS, FORMATS, INTERLEAVED, K_ACTIVATIONS
from radixlm.model.layers.moe import native
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.moe.fused_moe import _PATHS, fused_experts, fused_experts_torch
from tests.kernels.test_quant_gemm import random_quantized

E = 8
ROOT = Path(__file__).resolve().parents[2]
# Every format qlinear reads, and the interleaved layouts the loader makes of five of them.
LAYOUTS = [(n, False) for n in FORMATS] + [(n, True) for n in INTERLEAVED]
IDS = [f"{n}{'x8' if x else ''}" for n, x in LAYOUTS]
# (tokens, top_k, hot): hot=True puts every token on expert 5 (k = 1); T = 2, k = 2 leaves at
# least 4 of the 8 experts without a token.
ROUTINGS = [
    (1, 1, False),
    (1, 4, False),
    (2, 2, False),
    (37, 3, False),
    (300, 4, False),
    (300, 1, True),
]


def dims(name: str) -> tuple[int, int]:
    """(hidden, intermediate): blocks of the format; 16-bit floats off the 8-value vector widths."""
    if name in FLOAT16:
        return 70, 36
    return (256, 256) if FORMATS[name].block >= 128 else (64, 96)


def make_experts(
    name: str, interleave: bool, g: torch.Generator
) -> tuple[ExpertWeights, ExpertWeights]:
    H, I = dims(name)
    w13 = ExpertWeights(
        torch.stack([random_quantized(name, 2 * I, H, g) for _ in range(E)]),
        FORMATS[name],
        2 * I,
        H,
    )
    w2 = ExpertWeights(
        torch.stack([random_quantized(name, H, I, g) for _ in range(E)]), FORMATS[name], H, I
    )
    if interleave:
        w13, w2 = w13.interleaved(parts=2), w2.interleaved()
        assert w13.fmt.group == 8 and w2.fmt.group == 8
    return w13, w2


def routing(T: int, k: int, hot: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """topk weights (softmax then top-k, as Mixtral's router) and int32 ids."""
    tw, ti = torch.topk(torch.randn(T, E, generator=g).softmax(-1), k)
    if hot:
        ti = torch.full_like(ti, 5)
    return tw, ti.to(torch.int32)


def op(kernel_ops, x, tw, ti, w13, w2):
    return kernel_ops.fused_moe(x, ti, tw, w13.data, w13.fmt.kernel_id, w2.data, w2.fmt.kernel_id)


def per_value(blocks: torch.Tensor, block: int = 32) -> torch.Tensor:
    """[n, K / block] per-block values -> [n, K]."""
    return blocks.double().repeat_interleave(block, dim=1)


def block_max(v: torch.Tensor, block: int = 32) -> torch.Tensor:
    return per_value(v.view(v.shape[0], -1, block).amax(-1), block)


def act_quantizer(kernel_ops, w: ExpertWeights):
    """How the op rounds a matmul's input for these weights: (quantize fn, values per scale)."""
    if w.fmt.name in K_ACTIVATIONS:  # Q8_K activations: one scale per 256 values
        return (lambda x: kernel_ops.quantize_act_k(x)[:2]), 256
    return (lambda x: kernel_ops.quantize_act(x)[:2]), 32


def naive_reference(
    kernel_ops, x, tw, ti, w13: ExpertWeights, w2: ExpertWeights, b13=None, b2=None, swiglu=None
):
    """The (token, slot) loop in float64 on the dequantized weights, with the activations rounded to
    int8 as the kernels round them (quantize_act, or quantize_act_k for K_ACTIVATIONS, per row: x for
    gate / up, the SiLU output for down;
    16-bit and FP8 float weights keep fp32 activations), and a bound on the op's distance to it: float32
    rounding, 1e-5 of each dot's sum of |terms| (test_quant_gemm's EXACT_RTOL), through SiLU
    (|silu'| <= 1.1); and where that error could move the op's SiLU output across an int8 rounding
    boundary (or its block scale), the step it would cost. b13 / b2: per-expert biases; swiglu:
    (alpha, limit) of gpt-oss's clamped SwiGLU in place of SiLU (its slope in g at most
    (|u| + 1) (1 + alpha |g| / 4)). Returns (reference, bound)."""
    W13, W2 = w13.dequantize().double(), w2.dequantize().double()
    int8_13 = w13.fmt.name not in FLOAT_ACTIVATIONS
    int8_2 = w2.fmt.name not in FLOAT_ACTIVATIONS
    quant13, block13 = act_quantizer(kernel_ops, w13)
    quant2, block2 = act_quantizer(kernel_ops, w2)
    I = w2.cols
    out = torch.zeros(x.shape, dtype=torch.float64)
    bound = torch.zeros_like(out)
    for e in range(E):
        tokens, slots = (ti == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        xe, we = x[tokens], tw[tokens, slots].double()[:, None]
        if int8_13:
            q, d = quant13(xe)
            xe = q.double() * per_value(d, block13)
        xe = xe.double()
        gu = xe @ W13[e].T
        dgu = 1e-5 * (xe.abs() @ W13[e].abs().T)
        if b13 is not None:
            gu = gu + b13[e].double()
            dgu = dgu + 1e-6 * gu.abs()
        g, u, dg, du = gu[:, :I], gu[:, I:], dgu[:, :I], dgu[:, I:]
        if swiglu is None:
            s = F.silu(g)
            a = s * u
            da = 1.1 * dg * u.abs() + (s.abs() + 1.1 * dg) * du + 1e-6 * a.abs()
        else:
            alpha, limit = swiglu
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            s = g * torch.sigmoid(alpha * g)
            a = (u + 1) * s
            slope = 1 + alpha * (g.abs() + dg) / 4
            da = slope * dg * (u.abs() + 1 + du) + s.abs() * du + 1e-6 * a.abs()
        if int8_2:
            q, d = quant2(a.float())
            step = per_value(d, block2)
            dstep = block_max(da, block2) / 127 * 1.01  # the op's block scale moves at most this
            ratio = a.float().double() / step.clamp_min(1e-30)
            near = (ratio - ratio.floor() - 0.5).abs() * step <= 2 * (
                da + ratio.abs() * dstep
            ) + 1e-6 * a.abs()
            a, da = q.double() * step, q.double().abs() * dstep + near * step
        y = a @ W2[e].T
        dy = da @ W2[e].abs().T + 1e-5 * (a.abs() @ W2[e].abs().T)
        if b2 is not None:
            y = y + b2[e].double()
            dy = dy + 1e-6 * y.abs()
        out.index_add_(0, tokens, we * y)
        bound.index_add_(0, tokens, we.abs() * dy + 1e-6 * (we * y).abs())
    return out, bound


@pytest.mark.parametrize("name,interleave", LAYOUTS, ids=IDS)
def test_op_equals_the_torch_path_and_the_naive_loop(kernel_ops, name, interleave):
    g = torch.Generator().manual_seed(IDS.index(f"{name}{'x8' if interleave else ''}"))
    w13, w2 = make_experts(name, interleave, g)
    H = w13.cols
    for T, k, hot in ROUTINGS:
        x = torch.randn(T, H, generator=g)
        tw, ti = routing(T, k, hot, g)
        out = op(kernel_ops, x, tw, ti, w13, w2)
        assert out.shape == (T, H) and out.dtype == torch.float32
        ref = fused_experts_torch(x, tw, ti, w13, w2)
        assert torch.equal(out, ref), (
            f"T={T} k={k}: max |op - torch path| {(out - ref).abs().max():.3g}"
        )
        naive, bound = naive_reference(kernel_ops, x, tw, ti, w13, w2)
        err = (out.double() - naive).abs()
        assert naive.abs().max() > 0 and (err <= bound).all(), (
            f"T={T} k={k}: {(err - bound).max():.3g} past the bound (max |ref|"
            f" {naive.abs().max():.3g})"
        )


@pytest.mark.parametrize(
    "name,interleave", [("mxfp4", True), ("mxfp4", False), ("q8_0", True), ("bf16", False)]
)
def test_gpt_oss_swiglu_with_biases_is_the_naive_loop(kernel_ops, name, interleave):
    """activation "swiglu" with b13 / b2 (gpt-oss's experts, SGLang's fused_experts options):
    within the naive loop's bound; a limit below the gates' range makes the clamps matter."""
    g = torch.Generator().manual_seed(7 + IDS.index(f"{name}{'x8' if interleave else ''}"))
    w13, w2 = make_experts(name, interleave, g)
    H, I = w13.cols, w2.cols
    b13, b2 = torch.randn(E, 2 * I, generator=g), torch.randn(E, H, generator=g)
    for T, k, hot in ROUTINGS[1:4]:
        x = torch.randn(T, H, generator=g)
        tw, ti = routing(T, k, hot, g)
        gates = max(
            (x @ w13.dequantize()[e, :I].T + b13[e, :I]).abs().max().item() for e in range(E)
        )
        alpha, limit = 1.702, gates / 4  # a quarter of the range: some gates and ups clamped
        args = (w13.data, w13.fmt.kernel_id, w2.data, w2.fmt.kernel_id, b13, b2, "swiglu")
        out = kernel_ops.fused_moe(x, ti, tw, *args, alpha, limit)
        naive, bound = naive_reference(
            kernel_ops, x, tw, ti, w13, w2, b13, b2, swiglu=(alpha, limit)
        )
        err = (out.double() - naive).abs()
        assert naive.abs().max() > 0 and (err <= bound).all(), (
            f"T={T} k={k}: {(err - bound).max():.3g} past the bound"
        )
        silu = naive_reference(kernel_ops, x, tw, ti, w13, w2, b13, b2)[0]
        assert (out.double() - silu).abs().max() > 10 * bound.max()  # not SiLU's answer


@pytest.mark.parametrize("name,interleave", LAYOUTS, ids=IDS)
def test_a_tokens_row_does_not_depend_on_its_batch(kernel_ops, name, interleave):
    g = torch.Generator().manual_seed(100 + IDS.index(f"{name}{'x8' if interleave else ''}"))
    w13, w2 = make_experts(name, interleave, g)
    T, k = 37, 3
    x = torch.randn(T, w13.cols, generator=g)
    tw, ti = routing(T, k, False, g)
    out = op(kernel_ops, x, tw, ti, w13, w2)
    perm = torch.randperm(T, generator=g)[:20]  # another batch: a subset, reordered
    assert torch.equal(op(kernel_ops, x[perm], tw[perm], ti[perm], w13, w2), out[perm])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # alone, on one thread: other tasks, other slices
        for t in range(0, T, 4):
            assert torch.equal(
                op(kernel_ops, x[t : t + 1], tw[t : t + 1], ti[t : t + 1], w13, w2), out[t : t + 1]
            ), f"token {t}"
    finally:
        torch.set_num_threads(threads)


def test_ids_of_minus_one_are_skipped(kernel_ops):
    """-1 (an expert another rank holds, under expert parallelism) contributes nothing: bitwise the
    same as that slot weighted 0."""
    g = torch.Generator().manual_seed(7)
    w13, w2 = make_experts("q4_0", True, g)
    x = torch.randn(9, w13.cols, generator=g)
    tw, ti = routing(9, 3, False, g)
    drop = torch.rand(9, 3, generator=g) < 0.4
    zeroed = op(kernel_ops, x, tw.masked_fill(drop, 0.0), ti, w13, w2)
    assert torch.equal(op(kernel_ops, x, tw, ti.masked_fill(drop, -1), w13, w2), zeroed)
    assert torch.equal(fused_experts_torch(x, tw, ti.masked_fill(drop, -1), w13, w2), zeroed)
    assert torch.equal(op(kernel_ops, x, tw, torch.full_like(ti, -1), w13, w2), torch.zeros_like(x))
    assert torch.equal(
        op(kernel_ops, x, tw, ti.long(), w13, w2), op(kernel_ops, x, tw, ti, w13, w2)
    )  # int64 ids


def test_fake_implementation_gives_the_output_shape(kernel_ops):
    """torch.compile traces the op through its fake (kernels/ops.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(8)
    w13, w2 = make_experts("q8_0", False, g)
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = op(
            kernel_ops,
            torch.empty(5, w13.cols),
            torch.empty(5, 2),
            torch.zeros(5, 2, dtype=torch.int32),
            w13,
            w2,
        )
    assert out.shape == (5, w13.cols) and out.dtype == torch.float32


def test_fused_experts_takes_the_native_op_for_quantized_cpu_weights(kernel_ops):
    g = torch.Generator().manual_seed(3)
    w13, w2 = make_experts("q8_0", True, g)
    x = torch.randn(5, w13.cols, generator=g)
    tw, ti = routing(5, 2, False, g)
    assert native.NAME in [p.name for p in _PATHS]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fused_experts(x, tw, ti, w13, w2)
    assert any(e.name == "radixlm::fused_moe" for e in prof.events())
    assert torch.equal(out, fused_experts_torch(x, tw, ti, w13, w2))
    dense = ExpertWeights(torch.randn(E, 2 * 16, 32), None, 2 * 16, 32)  # float32: the torch path
    assert not native.supports(x.device, dense, dense)


def test_long_batches_run_in_slices_with_the_same_values(kernel_ops, monkeypatch):
    g = torch.Generator().manual_seed(9)
    w13, w2 = make_experts("q4_k", True, g)
    x = torch.randn(23, w13.cols, generator=g)
    tw, ti = routing(23, 2, False, g)
    monkeypatch.setattr(native, "MAX_TOKENS", 5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fused_experts(x, tw, ti, w13, w2)
    assert sum(e.name == "radixlm::fused_moe" for e in prof.events()) == 5  # 23 tokens, 5 at a time
    assert torch.equal(out, fused_experts_torch(x, tw, ti, w13, w2))
    assert torch.equal(fused_experts(x[:0], tw[:0], ti[:0], w13, w2), x[:0])


def test_interleaved_experts_keep_their_values(kernel_ops):
    g = torch.Generator().manual_seed(4)
    for name in INTERLEAVED:
        w13, _ = make_experts(name, False, g)
        packed = w13.interleaved(parts=2)
        assert packed.fmt == INTERLEAVED[name] and packed.data.shape[:2] == (E, w13.rows // 8)
        assert torch.equal(packed.dequantize(), w13.dequantize())
    odd = ExpertWeights.from_float(torch.randn(2, 24, 64, generator=g), "q4_0")  # halves of 12 rows
    assert odd.interleaved(parts=2) is odd and odd.interleaved().fmt.group == 8


def test_bad_inputs_are_refused_by_name(kernel_ops):
    g = torch.Generator().manual_seed(5)
    w13, w2 = make_experts("q4_0", False, g)
    x = torch.randn(3, w13.cols, generator=g)
    tw, ti = routing(3, 2, False, g)
    fid = w13.fmt.kernel_id
    with pytest.raises(RuntimeError, match="topk_ids value 8 out of range"):
        kernel_ops.fused_moe(x, ti.masked_fill(ti == ti[0, 0], 8), tw, w13.data, fid, w2.data, fid)
    with pytest.raises(RuntimeError, match="topk_weights"):
        kernel_ops.fused_moe(x, ti, tw[:, :1], w13.data, fid, w2.data, fid)
    with pytest.raises(RuntimeError, match="w13"):
        kernel_ops.fused_moe(x, ti, tw, w13.data, FORMATS["q8_0"].kernel_id, w2.data, fid)
    with pytest.raises(RuntimeError, match="w2"):
        kernel_ops.fused_moe(x, ti, tw, w13.data, fid, w2.data[:, :, :-2].contiguous(), fid)
    with pytest.raises(RuntimeError, match="hidden"):
        kernel_ops.fused_moe(x.double(), ti, tw, w13.data, fid, w2.data, fid)
    with pytest.raises(RuntimeError, match="activation must be 'silu' or 'swiglu', got 'gelu'"):
        kernel_ops.fused_moe(x, ti, tw, w13.data, fid, w2.data, fid, None, None, "gelu")
    with pytest.raises(RuntimeError, match="b13 must be float32"):
        kernel_ops.fused_moe(x, ti, tw, w13.data, fid, w2.data, fid, torch.zeros(E, 3))
    with pytest.raises(RuntimeError, match="b2 must be float32"):
        kernel_ops.fused_moe(x, ti, tw, w13.data, fid, w2.data, fid, None, torch.zeros(E, 3))


# At T = 1 with k = 2, every other expert's pages are unreadable (mprotect PROT_NONE): reading any
# of their bytes kills the process with SIGSEGV. The control run routes to a guarded expert to show
# the guard bites.
GUARD = textwrap.dedent("""
    import ctypes, mmap, sys
    import torch
    from radixlm.kernels.formats import FORMATS
    from radixlm.kernels.ops import ops
    from radixlm.model.layers.moe.experts import ExpertWeights
    from tests.kernels.test_quant_gemm import random_quantized

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    keep = []

    def guarded(w, chosen):
        mm = mmap.mmap(-1, w.data.nbytes)  # fresh page-aligned memory
        keep.append(mm)
        data = torch.frombuffer(mm, dtype=torch.uint8).view(w.data.shape)
        data.copy_(w.data)
        base, per = ctypes.addressof(ctypes.c_char.from_buffer(mm)), w.data[0].nbytes
        def protect():
            for e in range(w.num_experts):
                if e in chosen:
                    continue
                lo = -(-(base + e * per) // mmap.PAGESIZE) * mmap.PAGESIZE
                hi = (base + (e + 1) * per) // mmap.PAGESIZE * mmap.PAGESIZE
                assert hi - lo >= mmap.PAGESIZE, "an expert smaller than two pages"
                assert libc.mprotect(lo, hi - lo, 0) == 0, ctypes.get_errno()
        return ExpertWeights(data, w.fmt, w.rows, w.cols), protect

    g = torch.Generator().manual_seed(0)
    E, H, I, chosen = 8, 512, 512, (2, 6)
    route = [int(a) for a in sys.argv[1].split(",")]
    for name, inter in (("q4_0", True), ("q4_k", False), ("q6_k", True), ("f16", False), ("int8", False)):
        w13 = ExpertWeights(torch.stack([random_quantized(name, 2 * I, H, g) for _ in range(E)]), FORMATS[name], 2 * I, H)
        w2 = ExpertWeights(torch.stack([random_quantized(name, H, I, g) for _ in range(E)]), FORMATS[name], H, I)
        if inter:
            w13, w2 = w13.interleaved(parts=2), w2.interleaved()
        (g13, p13), (g2, p2) = guarded(w13, chosen), guarded(w2, chosen)
        x, tw, ti = torch.randn(1, H, generator=g), torch.tensor([[0.7, 0.3]]), torch.tensor([route], dtype=torch.int32)
        run = lambda: ops().fused_moe(x, ti, tw, g13.data, g13.fmt.kernel_id, g2.data, g2.fmt.kernel_id)
        before = run()
        p13(), p2()
        assert torch.equal(run(), before) and before.abs().max() > 0, name
        print(name, "ok", flush=True)
""")


def test_batch_one_reads_only_the_chosen_experts(kernel_ops):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }

    def guard(route: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", GUARD, route],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    ok = guard("2,6")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.split() == [
        "q4_0",
        "ok",
        "q4_k",
        "ok",
        "q6_k",
        "ok",
        "f16",
        "ok",
        "int8",
        "ok",
    ]
    control = guard("2,5")  # expert 5 is guarded: the first format's call must die on its pages
    assert control.returncode == -11, (control.returncode, control.stdout + control.stderr)
