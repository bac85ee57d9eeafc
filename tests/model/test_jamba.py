"""Jamba (JambaForCausalLM: Mamba-1 layers with weighted RMS norms on dt / B / C, attention without
position encoding, MoE feed-forwards on every other layer; models/jamba.py) end to end against HF
transformers in float32: greedy tokens alone, batched and in prefill chunks smaller than the
prompt (near-tie rule), the radix cache exact with the attention layer's KV and the Mamba layers'
state snapshots (cache_checks.py: a cached answer equals the engine's uncached one); llama.cpp's
`jamba` file of the same weights answering alike through a small pool; configs radixlm cannot run
refused by name, and a `jamba` GGUF whose layer pattern is no period refused."""

from __future__ import annotations

import pytest

from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.mamba_gguf_writer import write_jamba_gguf
from tests.model.ssm_checkpoints import CONFIGS, ssm_checkpoint
from tests.model.windowed_checkpoints import VOCAB

ARCH = "JambaForCausalLM"
# Prefill chunks of 32: the greedy prompts of 33 and 45 tokens take two.
STATES = dict(max_mamba_cache_size=64, chunk=32)
POOL = dict(max_total_tokens=2048)  # the cache checks' (small: cheap invariant checks)


@pytest.fixture(scope="module")
def jamba(tmp_path_factory):
    return ssm_checkpoint(ARCH, str(tmp_path_factory.mktemp("jamba")))


def test_safetensors_greedy_and_cache(jamba):
    """HF's tokens alone, batched and chunked; the cached answers equal the engine's own uncached
    ones exactly."""
    path, hf = jamba
    check_greedy_and_cache(path, hf, "jamba", uncached_reference=True, **STATES, **POOL)


def test_gguf_greedy_and_evictions(jamba, tmp_path):
    """The converter's float32 file: HF's tokens; through a small pool the cached answers equal
    the uncached ones."""
    path, hf = jamba
    gguf_path = write_jamba_gguf(path, str(tmp_path / "f32.gguf"))
    check_greedy_and_evictions(gguf_path, hf, "jamba gguf", uncached_reference=True, **STATES)


def test_q8_0_gguf_agrees_with_hf_top1(tmp_path):
    """The native kernels on the file's Q8_0 blocks: top-1 agreement >= 95% with HF holding the
    file's weights (the convolutions and the router float32, as the converter keeps them),
    on a checkpoint with GPT-2's residual init (ssm_checkpoint's scaled_residual)."""
    from tests.model.hybrid_checkpoints import dequantized_as_q8_0
    from tests.model.top1_agreement import top1_agreement

    path, hf = ssm_checkpoint(ARCH, str(tmp_path / "hf"), scaled_residual=True)
    q8 = write_jamba_gguf(path, str(tmp_path / "q8_0.gguf"), qtype="q8_0")
    agree, total = top1_agreement(
        q8, hf, dequantized_as_q8_0(hf, kept_float=("router.weight",)), VOCAB, new_tokens=60
    )
    print(f"jamba Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"jamba Q8_0: top-1 agreement {agree}/{total}"


@pytest.mark.parametrize("change, field", [(dict(hidden_act="gelu"), "hidden_act")])
def test_unsupported_configs_are_refused_by_name(change, field):
    import transformers

    from radixlm.model.registry import MODEL_REGISTRY

    cfg = transformers.JambaConfig(**CONFIGS[ARCH][1], vocab_size=64)
    cfg.architectures = [ARCH]
    for k, v in change.items():  # set after HF's own checks: radixlm's refusal is what is tested
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=field):
        MODEL_REGISTRY.get(ARCH)(cfg)


def test_gguf_layer_pattern_not_periodic_is_refused(tmp_path):
    """A file whose attention layers are no period and offset (HF's Jamba rule) is refused naming
    them, not read as another pattern."""
    from radixlm.model.gguf.archs.mamba import _period

    assert _period([1, 5], 8, "attention", "jamba") == (4, 1)
    assert _period([3], 4, "attention", "jamba") == (4, 3)
    with pytest.raises(ValueError, match=r"attention layers \[1, 2, 5\]"):
        _period([1, 2, 5], 8, "attention", "jamba")
