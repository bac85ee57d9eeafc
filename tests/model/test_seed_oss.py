"""Seed-OSS (SeedOssForCausalLM: Llama with q/k/v biases, its own o_proj and MLP bias switches)
against HF: greedy tokens from the safetensors and from llama.cpp's `seed_oss` GGUF, the radix
cache exact, a Q8_0 GGUF's top-1; q/k/v, o_proj and MLP biases all on."""

from __future__ import annotations

import pytest

from radixlm.model.loader import load_model
from tests.model.cache_checks import check_cached_prefixes, check_eviction_through_a_small_pool
from tests.model.family_checks import (
    check_gguf_greedy,
    check_quantized_top1,
    family_checkpoint,
    with_config,
)
from tests.model.windowed_checkpoints import check_greedy


@pytest.fixture(scope="module")
def seed_oss(tmp_path_factory):
    # every bias on (the released configs have q/k/v's only): each where its switch says, from
    # the safetensors and the GGUF (whose config reads the switches from the tensors present)
    return family_checkpoint(
        tmp_path_factory,
        "SeedOssConfig",
        "SeedOssForCausalLM",
        attention_out_bias=True,
        mlp_bias=True,
    )


def test_safetensors_and_gguf_greedy_match_hf(seed_oss, tmp_path):
    path, hf = seed_oss
    assert load_model(path).architecture == "SeedOssForCausalLM"
    check_greedy(path, hf, "seed_oss")
    check_gguf_greedy(path, hf, str(tmp_path / "f32.gguf"), "seed_oss", "seed_oss")


def test_radix_cache_stays_exact(seed_oss):
    path, hf = seed_oss
    check_cached_prefixes(path, hf, "seed_oss")
    check_eviction_through_a_small_pool(path, hf, "seed_oss", swa_full_tokens_ratio=0.5)


def test_quantized_gguf_top1(seed_oss, tmp_path):
    path, hf = seed_oss
    check_quantized_top1(path, hf, tmp_path, "seed_oss", "seed_oss")


def test_other_activation_refused_by_field(seed_oss, tmp_path):
    path, _ = seed_oss
    with pytest.raises(ValueError, match="SeedOssForCausalLM hidden_act 'gelu'"):
        load_model(with_config(path, tmp_path, hidden_act="gelu"))
