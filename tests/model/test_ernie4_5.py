"""ERNIE 4.5 dense (Ernie4_5ForCausalLM: Llama whose RoPE rotates interleaved pairs, tied
embeddings) against HF: greedy tokens from the safetensors and from llama.cpp's `ernie4_5` GGUF
(q / k rows as HF has them: reordered at load for either source), the radix cache exact,
quantized GGUFs' top-1 (the one-op decoder runs them: reordered rows, plain RoPE)."""

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
def ernie(tmp_path_factory):
    return family_checkpoint(tmp_path_factory, "Ernie4_5Config", "Ernie4_5ForCausalLM")


def test_safetensors_and_gguf_greedy_match_hf(ernie, tmp_path):
    path, hf = ernie
    assert load_model(path).architecture == "Ernie4_5ForCausalLM"
    check_greedy(path, hf, "ernie4_5")
    check_gguf_greedy(path, hf, str(tmp_path / "f32.gguf"), "ernie4_5", "ernie4_5")


def test_radix_cache_stays_exact(ernie):
    path, hf = ernie
    check_cached_prefixes(path, hf, "ernie4_5")
    check_eviction_through_a_small_pool(path, hf, "ernie4_5", swa_full_tokens_ratio=0.5)


def test_quantized_gguf_top1(ernie, tmp_path):
    path, hf = ernie
    check_quantized_top1(path, hf, tmp_path, "ernie4_5", "ernie4_5", qtypes=("q8_0", "q4_k_m"))


def test_other_activation_refused_by_field(ernie, tmp_path):
    path, _ = ernie
    with pytest.raises(ValueError, match="Ernie4_5ForCausalLM hidden_act 'gelu'"):
        load_model(with_config(path, tmp_path, hidden_act="gelu"))
