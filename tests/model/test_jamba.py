"""Jamba (JambaForCausalLM: Mamba-1 layers with weighted RMS norms on dt / B / C, attention without
position encoding, MoE feed-forwards on every other layer; models/jamba.py) end to end against HF
transformers in float32: greedy tokens alone, batched and in prefill chunks smaller than the
prompt (near-tie rule), the radix cache exact with the attention layer's KV and the Mamba layers'
state snapshots (cache_checks.py), configs radixlm cannot run refused by name, and a `jamba` GGUF
whose layer pattern is no period refused."""

from __future__ import annotations

import pytest

from tests.model.cache_checks import check_greedy_and_cache
from tests.model.ssm_checkpoints import CONFIGS, ssm_checkpoint

ARCH = "JambaForCausalLM"
STATES = dict(max_mamba_cache_size=64)


@pytest.fixture(scope="module")
def jamba(tmp_path_factory):
    return ssm_checkpoint(ARCH, str(tmp_path_factory.mktemp("jamba")))


def test_safetensors_greedy_and_cache(jamba):
    path, hf = jamba
    check_greedy_and_cache(path, hf, "jamba", **STATES)


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
