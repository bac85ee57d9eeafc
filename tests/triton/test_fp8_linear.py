"""FP8 weights (--quantization fp8, layers/fp8_linear.py): the W8A16 Triton GEMM against a float32
product with the dequantized weight (ragged shapes, bfloat16 and float32 activations, a scale per
output row and 128 x 128 block scales, every config the GPU may pick); the round trip of the
quantization at load (e4m3's spacing bounds every error); a tiny Llama with --quantization fp8,
greedy, against the same model in float32 on its dequantized weights (the near-tie rule of
tests/e2e); one-batch's bytes per step counting the FP8 weights as held; the refusal off CUDA.
Without a GPU the kernel runs in Triton's interpreter; with one, compiled (tuned where a test does
not name a config)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch

from radixlm.model.layers.fp8_linear import Fp8Matrix, expand_scale, quantize_fp8
from radixlm.model.loader import load_model
from tests.e2e.test_default_model_greedy import NEAR_TIE, assert_greedy_equal
from tests.model.helpers import SMALL, PoolHarness, save_random_llama
from tests.model.test_random_weights import write_config
from tests.triton.conftest import requires_triton

pytestmark = requires_triton

SHAPES = [(1, 70, 100), (3, 200, 300), (17, 33, 130)]  # M, N, K: ragged against every block
# The tiny Llama in bfloat16 (its norms, embeddings, LM head and activations; the same FP8 weights)
# differs from the float32 reference by at most 0.046 in a logit along three prompts' reference
# continuations, teacher-forced in the interpreter (logits up to ~5): a step whose top-2 gap is
# under 0.2 (4.3x that) may flip, a wider one may not (tests/gpu's bfloat16 rule, measured here).
BF16_NEAR_TIE = 0.2
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _configs():
    from radixlm.kernels.triton_ops import fp8_gemm

    seen = {}
    for c in fp8_gemm.SMALL_M + fp8_gemm.MEDIUM_M + fp8_gemm.LARGE_M:
        seen.setdefault(str(c), c)
    return list(seen.values())


def _weights(n: int, k: int, block: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n * k + block)
    w = torch.randn(n, k, generator=g) * torch.logspace(-2, 1, n)[:, None]  # rows of every size
    return quantize_fp8(w.to(device), block)


def _check(x, q, scale, block, config, what):
    from radixlm.kernels.triton_ops.fp8_gemm import fp8_linear

    got = fp8_linear(x, q, scale, block, config)
    ref = x.float() @ Fp8Matrix(q, scale, block).dequantize().T
    assert got.dtype == x.dtype and got.shape == ref.shape, what
    err = (got.float() - ref).abs()
    if x.dtype == torch.float32:
        bound = 1e-5 * ref.abs().max().clamp_min(1.0)
    else:  # one rounding to bfloat16 (2^-9 of the value, 2^-8 toward zero in the interpreter)
        bound = 2**-7 * ref.abs() + 1e-5 * ref.abs().max()
    assert (err <= bound).all(), f"{what}: max error {err.max().item():.3g}"


@pytest.mark.parametrize("block", [0, 128], ids=["per-row", "block128"])
def test_kernel_equals_float32_product_with_the_dequantized_weight(block, triton_device):
    from radixlm.kernels.triton_ops import fp8_gemm, interpreting

    g = torch.Generator().manual_seed(0)
    for m, n, k in SHAPES:
        q, scale = _weights(n, k, block, triton_device)
        # float32 activations at M 1 only on a GPU (each variant is a compile there).
        for dtype in (torch.bfloat16, torch.float32)[: 2 if interpreting() or m == 1 else 1]:
            x = torch.randn(m, k, generator=g).to(triton_device, dtype)
            # On a GPU each bucket's first config (fewer compiles); the interpreter's own otherwise.
            config = None if interpreting() else fp8_gemm.BUCKETS[fp8_gemm.m_bucket(m)][0]
            _check(x, q, scale, block, config, f"M {m} N {n} K {k} {dtype}")
    # Every config the GPU may pick (split-K's empty last split included: 3 K tiles over 4 splits).
    q, scale = _weights(70, 300, block, triton_device)
    x = torch.randn(17, 300, generator=g).to(triton_device, torch.bfloat16)
    for config in _configs() if interpreting() else []:
        _check(x, q, scale, block, config, f"config {config}")
    if not interpreting() and not block:  # the tuner on a decode shape (the engine's compiles)
        q, scale = _weights(512, 256, block, triton_device)
        x = torch.randn(4, 256, generator=g).to(triton_device, torch.bfloat16)
        _check(x, q, scale, block, None, "tuned")


@pytest.mark.parametrize("block", [0, 128], ids=["per-row", "block128"])
def test_quantize_round_trip(block, triton_device):
    n, k = 150, 200  # ragged against the 128 x 128 blocks
    g = torch.Generator().manual_seed(1)
    w = torch.randn(n, k, generator=g) * torch.logspace(-4, 2, n)[:, None]
    w[5] = 0.0  # an all-zero row
    w[7, : k // 2] *= 1e-4  # values far below their row's largest: e4m3's subnormals
    q, scale = quantize_fp8(w.to(triton_device), block)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == ((2, 2) if block else (n,))
    q, scale = q.cpu(), scale.cpu()
    # Each row's (block's) largest magnitude becomes e4m3's largest finite value, 448.
    if block:
        pad = torch.zeros(256, 256)
        pad[:n, :k] = q.float().abs()
        amax = pad.view(2, 128, 2, 128).amax(dim=(1, 3))
        assert torch.equal(amax, torch.full((2, 2), 448.0))
    else:
        amax = q.float().abs().amax(dim=1)
        assert torch.equal(amax[w.abs().amax(dim=1) > 0], torch.full((n - 1,), 448.0))
        assert scale[5] == 1.0 and not q[5].float().any()
    deq = Fp8Matrix(q, scale, block).dequantize()
    # Half e4m3's spacing: 2^-4 of a normal value, 2^-10 of the scale below 2^-6 (subnormals).
    bound = torch.maximum(w.abs() * 2**-4, expand_scale(scale, n, k, block) * 2**-10)
    assert ((deq - w).abs() <= bound * (1 + 1e-6)).all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-fp8")
    _, config = save_random_llama(path)
    return config, str(path)


def _greedy(model, config, prompt, steps, device, kv_dtype):
    """Greedy tokens after `prompt` and the logits each was picked from."""
    h = PoolHarness(model, config, kv_dtype=kv_dtype, device=device)
    r = h.new_request()
    logits = h.extend([r], [prompt])[0][-1]
    tokens, rows = [], []
    for _ in range(steps):
        rows.append(logits.float().cpu())
        tokens.append(int(logits.argmax()))
        logits = h.decode([r], [tokens[-1]])[0]
    return tokens, torch.stack(rows)


@pytest.mark.parametrize(
    "dtype,near_tie",
    [(torch.float32, NEAR_TIE), (torch.bfloat16, BF16_NEAR_TIE)],
    ids=["float32", "bfloat16"],
)
def test_tiny_llama_fp8_greedy_equals_float32_on_the_dequantized_weights(
    tiny, dtype, near_tie, triton_device
):
    config, path = tiny
    loaded = load_model(path, dtype=dtype, device=str(triton_device), quantization="fp8")
    model = loaded.model
    assert loaded.quantization == "fp8"
    held = {
        n for n, m in model.named_modules() if isinstance(getattr(m, "qweight", None), Fp8Matrix)
    }
    assert held == {f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS}
    # The embeddings and the LM head stay in the model dtype; no float copy of an FP8 layer is left.
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == dtype
    assert all(
        model.get_submodule(n).weight is None and model.get_submodule(n).qweight.nbytes
        for n in held
    )
    # The reference: the checkpoint in float32 with every FP8 layer's dequantized weight.
    ref = load_model(path).model
    for name in held:
        ref.get_submodule(name).weight.data = model.get_submodule(name).qweight.dequantize().cpu()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, SMALL["vocab_size"], (9,), generator=g).tolist()
    gen, logits = _greedy(ref, config, prompt, 8, "cpu", torch.float32)
    got, _ = _greedy(model, config, prompt, 8, triton_device, dtype)
    assert_greedy_equal(got, (prompt, gen, logits), f"fp8 weights, {dtype}", near_tie)


def test_one_batch_counts_the_fp8_weights_as_held(tmp_path, triton_device, monkeypatch):
    import argparse

    from radixlm.bench import one_batch
    from radixlm.config import ServerArgs

    # One timing of the products alone (20 in the interpreter would take minutes).
    monkeypatch.setattr(
        one_batch, "matmul_reference", functools.partial(one_batch.matmul_reference, repeats=1)
    )
    p = argparse.ArgumentParser()
    one_batch.add_args(p)
    args = p.parse_args(["--batch-size", "2", "--input-len", "6", "--output-len", "3"])
    server_args = ServerArgs(
        model_path=write_config(tmp_path),  # SMALL's shape, vocabulary 1024, random weights
        device=str(triton_device),
        dtype="bfloat16",
        quantization="fp8",
        attention_backend="torch",
        disable_cuda_graph=True,
        num_threads=1,
    )
    (r,) = one_batch.run(args, server_args)
    assert r["quantization"] == "fp8" and len(r["output_ids"]) == 2
    h, i, layers, vocab = SMALL["hidden_size"], SMALL["intermediate_size"], 2, 1024
    kv = SMALL["num_key_value_heads"] * 16  # head_dim 16
    shapes = [(h + 2 * kv, h), (h, h), (2 * i, h), (h, i)]  # qkv, o, gate_up, down: (N, K)
    fp8 = layers * sum(n * k + 4 * n for n, k in shapes)  # 1 byte a weight, a float32 scale a row
    bf16 = 2 * (vocab * h + (2 * layers + 1) * h)  # the LM head and the norms (not the embedding)
    # Two requests' K and V in bfloat16 at the mid-decode context.
    kv_bytes = 2 * (2 * 2 * layers * kv) * (6 + (3 - 1) / 2)
    assert r["step_bytes_mb"] * 1e6 == pytest.approx(fp8 + bf16 + kv_bytes, rel=1e-9)
    # The matmul reference runs the same products: the FP8 layers' and the LM head's.
    flops = 2 * 2 * (layers * sum(n * k for n, k in shapes) + vocab * h)
    assert r["linear_flops"] == flops and r["roofline_share"] > 0


def test_fp8_is_refused_off_cuda_in_one_line(monkeypatch):
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    line = (
        "--quantization fp8 is CUDA-only (a Triton GEMM): the Triton kernels run on CUDA (on CPU"
        " only under Triton's interpreter, TRITON_INTERPRET=1, for tests)"
    )
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError) as e:
        ModelRunnerConfig(quantization="fp8")
    assert str(e.value) == line
    # At start-up, before any model is looked for: one line, no traceback.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "radixlm.cli", "generate", "--prompt", "hi", "--quantization"]
        + ["fp8", "--model-path", "/nonexistent"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"radixlm: error: {line}"]
