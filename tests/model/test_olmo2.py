"""OLMo 2 (Olmo2ForCausalLM), added by the recipe "a model family" (docs/architecture.md): a tiny
random float32 checkpoint gives HF's greedy tokens alone, batched and in prefill chunks smaller
than the prompt; the same weights as llama.cpp's converter writes them (`olmo2`, no window) are
read as OLMo 2 and answer alike; at --pp-size 2 too."""

from __future__ import annotations

import pytest

from radixlm.model.loader import load_model
from tests.model.windowed_checkpoints import check_greedy, checkpoint, write_gguf


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("olmo2"))
    hf = checkpoint("Olmo2Config", "Olmo2ForCausalLM", path)
    return path, hf


def test_safetensors_greedy_matches_hf(olmo2):
    path, hf = olmo2
    assert load_model(path).architecture == "Olmo2ForCausalLM"
    check_greedy(path, hf, "olmo2")


def test_gguf_greedy_matches_hf(olmo2, tmp_path):
    path, hf = olmo2
    gguf_path = write_gguf(hf, path, str(tmp_path / "f32.gguf"), "olmo2")
    assert load_model(gguf_path).architecture == "Olmo2ForCausalLM"
    check_greedy(gguf_path, hf, "olmo2 gguf")


def test_pp2_greedy_matches_hf(olmo2):
    path, hf = olmo2
    check_greedy(path, hf, "olmo2 pp=2", pp_size=2)
