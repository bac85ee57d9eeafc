"""Arcee AFM (ArceeForCausalLM: Llama whose MLP is up -> ReLU² -> down, no gate) and Apertus
(ApertusForCausalLM: the same MLP with xIELU, per-head q/k norms, llama3 RoPE) against HF: greedy
tokens from the safetensors and from llama.cpp's `arcee` / `apertus` GGUFs (arcee's q / k rows
permuted by LlamaModel; apertus' xIELU parameters in per-layer metadata arrays), the radix cache
exact, quantized GGUFs' top-1; an activation the family does not run refused by field."""

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


def apertus_header(w, hf) -> None:
    """ApertusModel.modify_tensors: each xIELU parameter as an array over the layers."""
    layers = hf.model.layers
    for param in ("alpha_n", "alpha_p", "beta", "eps"):
        values = [getattr(layer.mlp.act_fn, param).float().item() for layer in layers]
        getattr(w, f"add_xielu_{param}")(values)


FAMILIES = {
    # name: (config class, architecture, GGUF arch, header)
    "arcee": ("ArceeConfig", "ArceeForCausalLM", "arcee", None),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", "apertus", apertus_header),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    config_cls, arch, gguf_arch, header = FAMILIES[request.param]
    path, hf = family_checkpoint(tmp_path_factory, config_cls, arch)
    return request.param, path, hf, gguf_arch, header


def test_safetensors_and_gguf_greedy_match_hf(family, tmp_path):
    name, path, hf, gguf_arch, header = family
    assert load_model(path).architecture == hf.config.architectures[0]
    check_greedy(path, hf, name)
    check_gguf_greedy(path, hf, str(tmp_path / "f32.gguf"), gguf_arch, name, header)


def test_radix_cache_stays_exact(family):
    name, path, hf, _, _ = family
    check_cached_prefixes(path, hf, name)
    check_eviction_through_a_small_pool(path, hf, name, swa_full_tokens_ratio=0.5)


def test_quantized_gguf_top1(family, tmp_path):
    name, path, hf, gguf_arch, header = family
    check_quantized_top1(path, hf, tmp_path, gguf_arch, name, header, qtypes=("q8_0", "q4_k_m"))


def test_other_activation_refused_by_field(family, tmp_path):
    _, path, hf, _, _ = family
    bad = with_config(path, tmp_path, hidden_act="gelu")
    with pytest.raises(ValueError, match=f"{hf.config.architectures[0]} hidden_act 'gelu'"):
        load_model(bad)
