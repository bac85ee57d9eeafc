"""Command R7B / A (Cohere2ForCausalLM: parallel attention + MLP from one LayerNorm, windowed
layers with RoPE over interleaved pairs and global layers without RoPE, logit_scale, tied
embeddings; models/cohere2.py) end to end against HF transformers in float32: greedy tokens alone,
batched and in prefill chunks smaller than the prompt and the window (near-tie rule), the radix
cache exact with the windowed layers in their own slot space (tests/model/cache_checks.py), the
same weights as llama.cpp's converter writes them (cohere2) answering alike, its Q8_0 file's top-1
agreeing with HF holding the file's weights, and configs radixlm cannot run refused by name."""

from __future__ import annotations

import pytest

from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.converter_gguf import assert_file_holds, write_gguf
from tests.model.windowed_checkpoints import VOCAB, WINDOW, checkpoint


@pytest.fixture(scope="module")
def cohere2(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cohere2"))
    hf = checkpoint(
        "Cohere2Config",
        "Cohere2ForCausalLM",
        path,
        max_position_embeddings=1024,
        sliding_window=WINDOW,  # layer_types: HF's default, 3 windowed layers then a global one
        logit_scale=0.75,
        layer_norm_eps=1e-5,
    )
    assert hf.config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    return path, hf


def test_safetensors_greedy_and_cache(cohere2):
    path, hf = cohere2
    check_greedy_and_cache(path, hf, "cohere2")


def test_gguf_greedy_and_evictions(cohere2, tmp_path):
    """The converter's float32 file: HF's tokens, also through a small pool (the windowed
    layers' space halved)."""
    path, hf = cohere2
    gguf_path = write_gguf(hf, path, str(tmp_path / "f32.gguf"), "cohere2")
    assert_file_holds(hf, gguf_path)  # every weight read back exactly
    check_greedy_and_evictions(gguf_path, hf, "cohere2 gguf", swa_full_tokens_ratio=0.5)


def test_q8_0_gguf_agrees_with_hf_top1(cohere2, tmp_path):
    """The native kernels on the file's Q8_0 blocks (the tied head too): top-1 agreement >= 95%
    with HF holding the file's weights."""
    from tests.model.hybrid_checkpoints import dequantized_as_q8_0
    from tests.model.top1_agreement import top1_agreement

    path, hf = cohere2
    q8 = write_gguf(hf, path, str(tmp_path / "q8_0.gguf"), "cohere2", qtype="q8_0")
    agree, total = top1_agreement(q8, hf, dequantized_as_q8_0(hf), VOCAB, new_tokens=120)
    print(f"cohere2 Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"cohere2 Q8_0: top-1 agreement {agree}/{total}"


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, field):
    import transformers

    from radixlm.model.models.cohere2 import Cohere2ForCausalLM

    cfg = transformers.Cohere2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, sliding_window=8,
    )  # fmt: skip
    for key, value in change.items():  # past the config's own validation
        setattr(cfg, key, value)
    with pytest.raises(ValueError, match=field):
        Cohere2ForCausalLM(cfg)
