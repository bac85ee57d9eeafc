"""Ministral 3 (Ministral3ForCausalLM: Mistral with YaRN and Llama 4's attention temperature on
q past the original context) against HF: greedy tokens from the safetensors and from llama.cpp's
`mistral3` GGUF (LlamaModel's q / k permutation, its YaRN log multiplier and temperature scale),
the radix cache exact (its prompts reach 12x the original context: the temperature grows), and
quantized GGUFs' top-1; a config without the temperature refused by field."""

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

ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,  # the temperature steps every 16 positions
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
}


def header(w, hf) -> None:
    """Ministral3Model.set_gguf_parameters (model_type ministral3)."""
    rope = hf.config.rope_parameters
    w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
    w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])


@pytest.fixture(scope="module")
def ministral3(tmp_path_factory):
    return family_checkpoint(
        tmp_path_factory, "Ministral3Config", "Ministral3ForCausalLM", rope_parameters=ROPE
    )


def test_safetensors_and_gguf_greedy_match_hf(ministral3, tmp_path):
    path, hf = ministral3
    assert load_model(path).architecture == "Ministral3ForCausalLM"
    check_greedy(path, hf, "ministral3")
    check_gguf_greedy(path, hf, str(tmp_path / "f32.gguf"), "mistral3", "ministral3", header)


def test_radix_cache_stays_exact(ministral3):
    path, hf = ministral3
    check_cached_prefixes(path, hf, "ministral3")
    check_eviction_through_a_small_pool(path, hf, "ministral3", swa_full_tokens_ratio=0.5)


def test_quantized_gguf_top1(ministral3, tmp_path):
    path, hf = ministral3
    check_quantized_top1(path, hf, tmp_path, "mistral3", "ministral3", header)


def test_missing_temperature_refused_by_field(ministral3, tmp_path):
    path, _ = ministral3
    rope = {k: v for k, v in ROPE.items() if k != "llama_4_scaling_beta"}
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        load_model(with_config(path, tmp_path, rope_parameters=rope))
