"""EXAONE 4.0 (Exaone4ForCausalLM: post-norms, per-head q/k norms, windowed layers that rotate
beside global NoPE ones) against HF: greedy tokens from the safetensors and from llama.cpp's
`exaone4` GGUF, the radix cache exact with the windowed-layer space, quantized GGUFs' top-1; a
config without a window (every layer global and rotating); bad configs refused by field."""

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
from tests.model.windowed_checkpoints import WINDOW, check_greedy

LAYER_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]


def header(w, hf) -> None:
    """Exaone4Model.set_gguf_parameters."""
    hp = hf.config.to_dict()
    w.add_vocab_size(hp["vocab_size"])
    if hp.get("sliding_window") is not None:
        w.add_sliding_window(hp["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in hp["layer_types"]])


@pytest.fixture(scope="module")
def exaone4(tmp_path_factory):
    return family_checkpoint(
        tmp_path_factory,
        "Exaone4Config",
        "Exaone4ForCausalLM",
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
    )


def test_safetensors_and_gguf_greedy_match_hf(exaone4, tmp_path):
    path, hf = exaone4
    assert load_model(path).architecture == "Exaone4ForCausalLM"
    check_greedy(path, hf, "exaone4")
    check_gguf_greedy(path, hf, str(tmp_path / "f32.gguf"), "exaone4", "exaone4", header)


def test_radix_cache_stays_exact(exaone4):
    path, hf = exaone4
    check_cached_prefixes(path, hf, "exaone4")
    check_eviction_through_a_small_pool(path, hf, "exaone4", swa_full_tokens_ratio=0.5)


def test_quantized_gguf_top1(exaone4, tmp_path):
    path, hf = exaone4
    check_quantized_top1(
        path, hf, tmp_path, "exaone4", "exaone4", header, qtypes=("q8_0", "q4_k_m")
    )


def test_no_window_every_layer_global_with_rope(tmp_path_factory):
    """Without a window (the 1.2B) every layer rotates: one prompt longer than a window, HF's
    tokens."""
    from tests.model import cache_checks as cc

    path, hf = family_checkpoint(
        tmp_path_factory,
        "Exaone4Config",
        "Exaone4ForCausalLM",
        sliding_window=None,
        layer_types=["full_attention"] * 4,
    )
    prompt = cc.ids(8, 45)
    with cc.engine(path) as e:
        cc.check(cc.generate(e, prompt, 16), hf, prompt, 16, "exaone4 global")


def test_bad_config_refused_by_field(exaone4, tmp_path):
    path, _ = exaone4
    with pytest.raises(ValueError, match="Exaone4 hidden_act 'gelu'"):
        load_model(with_config(path, tmp_path, hidden_act="gelu"))
