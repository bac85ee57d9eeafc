"""Bamba (BambaForCausalLM: Mamba-2 and attention layers with RoPE over half of each head, a SwiGLU
MLP after each; models/bamba.py) end to end against HF transformers in float32: greedy tokens
alone, batched and in prefill chunks smaller than the prompt (near-tie rule), the radix cache exact
with the KV of the attention layer and the Mamba layers' state snapshots (cache_checks.py: a
cached answer equals the engine's uncached one); the `granitehybrid` file llama.cpp's converter
writes for it answering alike through a small pool; configs radixlm cannot run refused by name."""

from __future__ import annotations

import pytest

from tests.model.bamba_gguf_writer import write_bamba_gguf
from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.ssm_checkpoints import CONFIGS, ssm_checkpoint
from tests.model.windowed_checkpoints import VOCAB

ARCH = "BambaForCausalLM"
# Prefill chunks of 32: the greedy prompts of 33 and 45 tokens take two.
STATES = dict(max_mamba_cache_size=64, chunk=32)
POOL = dict(max_total_tokens=2048)  # the cache checks' (small: cheap invariant checks)


@pytest.fixture(scope="module")
def bamba(tmp_path_factory):
    return ssm_checkpoint(ARCH, str(tmp_path_factory.mktemp("bamba")))


def test_safetensors_greedy_and_cache(bamba):
    """HF's tokens alone, batched and chunked; the cached answers equal the engine's own uncached
    ones exactly."""
    path, hf = bamba
    check_greedy_and_cache(path, hf, "bamba", uncached_reference=True, **STATES, **POOL)


def test_gguf_greedy_and_evictions(bamba, tmp_path):
    """The converter's float32 file: HF's tokens; through a small pool the cached answers equal
    the uncached ones."""
    path, hf = bamba
    gguf_path = write_bamba_gguf(path, str(tmp_path / "f32.gguf"))
    check_greedy_and_evictions(gguf_path, hf, "bamba gguf", uncached_reference=True, **STATES)


def test_q8_0_gguf_agrees_with_hf_top1(tmp_path):
    """The native kernels on the file's Q8_0 blocks: top-1 agreement >= 95% with HF holding the
    file's weights (the convolutions float32, as the converter keeps them),
    on a checkpoint with GPT-2's residual init (ssm_checkpoint's scaled_residual)."""
    from tests.model.hybrid_checkpoints import dequantized_as_q8_0
    from tests.model.top1_agreement import top1_agreement

    path, hf = ssm_checkpoint(ARCH, str(tmp_path / "hf"), scaled_residual=True)
    q8 = write_bamba_gguf(path, str(tmp_path / "q8_0.gguf"), qtype="q8_0")
    agree, total = top1_agreement(q8, hf, dequantized_as_q8_0(hf), VOCAB, new_tokens=60)
    print(f"bamba Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"bamba Q8_0: top-1 agreement {agree}/{total}"


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(mamba_n_groups=3), "n_groups"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, field):
    import transformers

    from radixlm.model.registry import MODEL_REGISTRY

    cfg = transformers.BambaConfig(**CONFIGS[ARCH][1], vocab_size=64)
    cfg.architectures = [ARCH]
    for k, v in change.items():  # set after HF's own checks: radixlm's refusal is what is tested
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=field):
        MODEL_REGISTRY.get(ARCH)(cfg)
