"""The pure state-space models (models/mamba.py: Mamba2ForCausalLM; MambaForCausalLM and
FalconMambaForCausalLM on the Mamba-1 mixer, linear_attn/mamba1.py) end to end against HF
transformers in float32: greedy tokens alone, batched and in prefill chunks smaller than the
prompt (near-tie rule), the radix cache exact with the mixers' state snapshots
(tests/model/cache_checks.py: no layer keeps KV; a cached answer equals the engine's uncached
one), the same weights as llama.cpp's converter writes them (`mamba2`, `mamba`) answering alike
through a small pool, a Q8_0 file's top-1 agreeing with HF holding its weights, and configs
radixlm cannot run refused by name. And Mamba-1's selective
scan, blocked, against its token-by-token statement in float64."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.converter_gguf import file_weights
from tests.model.mamba_gguf_writer import write_mamba_gguf
from tests.model.ssm_checkpoints import ssm_checkpoint
from tests.model.windowed_checkpoints import VOCAB

FAMILIES = ["Mamba2ForCausalLM", "MambaForCausalLM", "FalconMambaForCausalLM"]
# The states are small: room for every snapshot the cache checks keep (tracks every 256 tokens).
# Prefill chunks of 32: the greedy prompts of 33 and 45 tokens take two.
STATES = dict(max_mamba_cache_size=64, chunk=32)
# A pool without KV is sized from a nominal 256 bytes a slot (millions of slots): the cache checks'
# pool, so that the invariant checks after every step stay cheap.
POOL = dict(max_total_tokens=2048)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    arch = request.param
    # FalconMamba's B / C / dt norms: the file's epsilon is the one llama.cpp norms them with
    # (archs/mamba.py), so the checkpoint's two agree and the GGUF answers HF's tokens.
    extra = dict(mixer_rms_eps=1e-5) if arch == "FalconMambaForCausalLM" else {}
    path, hf = ssm_checkpoint(arch, str(tmp_path_factory.mktemp(arch)), **extra)
    return arch, path, hf


def test_safetensors_greedy_and_cache(family):
    """HF's tokens alone, batched and chunked; the cached answers equal the engine's own uncached
    ones exactly."""
    arch, path, hf = family
    check_greedy_and_cache(path, hf, arch, uncached_reference=True, **STATES, **POOL)


@pytest.mark.parametrize("family", ["Mamba2ForCausalLM", "FalconMambaForCausalLM"], indirect=True)
def test_gguf_greedy_and_evictions(family, tmp_path):
    """The converter's float32 file (`mamba2`; `mamba` with ssm.dt_b_c_rms): every weight read back
    (A_log through the file's -exp(A_log): to float32's nearest), HF's tokens, and through a small
    pool the cached answers equal the uncached ones."""
    arch, path, hf = family
    gguf_path = write_mamba_gguf(path, str(tmp_path / "f32.gguf"))
    held = _holding(hf, gguf_path).state_dict()
    for name, t in hf.state_dict().items():
        if name.endswith("A_log"):
            torch.testing.assert_close(held[name], t, rtol=1e-6, atol=1e-7, msg=name)
        else:
            assert torch.equal(held[name], t), name
    check_greedy_and_evictions(gguf_path, hf, f"{arch} gguf", uncached_reference=True, **STATES)


# Mamba-2's Q8_0 file agrees 141/149 (94.6%; 179/190 without the scaled residual): left open, its
# dt through exp(dt A) with A up to 16 flips top-1 under activation rounding; llama-server on the
# same file: 142/149 and 181/190, flipping mostly the same positions (docs/models.md).
@pytest.mark.parametrize("arch", ["MambaForCausalLM"])
def test_q8_0_gguf_agrees_with_hf_top1(arch, tmp_path):
    """The native kernels on the file's Q8_0 blocks (rows that are no multiple of 32 in F16, as
    the converter falls back): top-1 agreement >= 95% with HF holding the file's weights, on a
    checkpoint with GPT-2's residual init (ssm_checkpoint's scaled_residual)."""
    from tests.model.top1_agreement import top1_agreement

    path, hf = ssm_checkpoint(arch, str(tmp_path / "hf"), scaled_residual=True)
    q8 = write_mamba_gguf(path, str(tmp_path / "q8_0.gguf"), qtype="q8_0")
    agree, total = top1_agreement(q8, hf, _holding(hf, q8), VOCAB, new_tokens=60)
    print(f"{arch} Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{arch} Q8_0: top-1 agreement {agree}/{total}"


def _holding(hf, gguf_path: str):
    """A copy of hf with the file's weights (dequantized by radixlm's loader), `model.` read as
    HF's `backbone.`."""
    weights = {n.replace("model.", "backbone.", 1): w for n, w in file_weights(gguf_path).items()}
    held = copy.deepcopy(hf)
    state = held.state_dict()
    if hf.config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["backbone.embeddings.weight"]
    assert set(weights) == set(state), set(weights) ^ set(state)
    held.load_state_dict(weights)
    return held.eval()


@pytest.mark.parametrize(
    "architecture, change, field",
    [
        ("Mamba2ForCausalLM", dict(hidden_act="gelu"), "hidden_act"),
        ("Mamba2ForCausalLM", dict(num_heads=4), "num_heads"),
        ("Mamba2ForCausalLM", dict(n_groups=3), "n_groups"),
        ("MambaForCausalLM", dict(hidden_act="relu"), "hidden_act"),
        ("FalconMambaForCausalLM", dict(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_unsupported_configs_are_refused_by_name(architecture, change, field):
    import transformers

    from radixlm.model.registry import MODEL_REGISTRY
    from tests.model.ssm_checkpoints import CONFIGS

    config_cls, base = CONFIGS[architecture]
    cfg = getattr(transformers, config_cls)(**base, vocab_size=64)
    cfg.architectures = [architecture]
    for k, v in change.items():  # set after HF's own checks: radixlm's refusal is what is tested
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=field):
        MODEL_REGISTRY.get(architecture)(cfg)


def _scan_token_by_token(x, dt, a, b, c, state):
    """Mamba-1's scan as written (selective_scan.py's docstring), one token at a time."""
    out = []
    for t in range(x.shape[0]):
        state.mul_((dt[t, :, None] * a).exp()).add_((dt[t] * x[t])[:, None] * b[t][None, :])
        out.append(state @ c[t])
    return torch.stack(out)


def test_selective_scan_equals_its_statement_float64():
    """Mamba-1's scan (selective_scan.py): the blocked recurrence (several blocks, a ragged last
    one, a state entering) equals the token-by-token statement in float64, outputs and final
    state; the batch entry point (a decode step, an extend of two requests) writes the states it
    reads."""
    from radixlm.model.layers.linear_attn.selective_scan import (
        BLOCK,
        selective_scan_batch,
        selective_scan_recurrent,
    )

    g = torch.Generator().manual_seed(0)
    n, d, s = BLOCK + 11, 24, 8
    f64 = dict(dtype=torch.float64)
    x, b, c = (torch.randn(n, k, generator=g, **f64) for k in (d, s, s))
    dt = torch.rand(n, d, generator=g, **f64) * 0.3
    a = -(torch.rand(d, s, generator=g, **f64) * 15 + 1)
    s0 = torch.randn(d, s, generator=g, **f64)
    want_state, got_state = s0.clone(), s0.clone()
    want = _scan_token_by_token(x, dt, a, b, c, want_state)
    got = selective_scan_recurrent(x, dt, a, b, c, got_state)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_state, want_state, rtol=1e-12, atol=1e-12)

    pool = torch.randn(4, d, s, generator=g, **f64)
    rows = torch.tensor([2, 0])
    ref = pool.clone()
    y = selective_scan_batch(x[:40], dt[:40], a, b[:40], c[:40], pool, rows, [30, 10])
    want = torch.cat(
        [
            _scan_token_by_token(x[:30], dt[:30], a, b[:30], c[:30], ref[2]),
            _scan_token_by_token(x[30:40], dt[30:40], a, b[30:40], c[30:40], ref[0]),
        ]
    )
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pool, ref, rtol=1e-12, atol=1e-12)
    y = selective_scan_batch(x[40:42], dt[40:42], a, b[40:42], c[40:42], pool, rows, [1, 1])
    step = torch.stack(
        [
            _scan_token_by_token(x[40:41], dt[40:41], a, b[40:41], c[40:41], ref[2])[0],
            _scan_token_by_token(x[41:42], dt[41:42], a, b[41:42], c[41:42], ref[0])[0],
        ]
    )
    torch.testing.assert_close(y, step, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pool, ref, rtol=1e-12, atol=1e-12)
