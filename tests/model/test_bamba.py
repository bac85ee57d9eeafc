"""Bamba (BambaForCausalLM: Mamba-2 and attention layers with RoPE over half of each head, a SwiGLU
MLP after each; models/bamba.py) end to end against HF transformers in float32: greedy tokens
alone, batched and in prefill chunks smaller than the prompt (near-tie rule), the radix cache exact
with the KV of the attention layer and the Mamba layers' state snapshots (cache_checks.py), and
configs radixlm cannot run refused by name."""

from __future__ import annotations

import pytest

from tests.model.cache_checks import check_greedy_and_cache
from tests.model.ssm_checkpoints import CONFIGS, ssm_checkpoint

ARCH = "BambaForCausalLM"
STATES = dict(max_mamba_cache_size=64)


@pytest.fixture(scope="module")
def bamba(tmp_path_factory):
    return ssm_checkpoint(ARCH, str(tmp_path_factory.mktemp("bamba")))


def test_safetensors_greedy_and_cache(bamba):
    path, hf = bamba
    check_greedy_and_cache(path, hf, "bamba", **STATES)


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
