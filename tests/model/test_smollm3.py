"""SmolLM3 (NoPE on every 4th layer) end to end: radixlm's greedy tokens are HF transformers'
(float32, near-tie rule) from safetensors and from the GGUF llama.cpp's converter writes (arch
smollm3: the NoPE layers fixed by llama.cpp, not written), alone, batched and in prefill chunks
smaller than the prompt; with use_sliding_window the NoPE layers are windowed too."""

from __future__ import annotations

import pytest

from radixlm.model.loader import load_model
from tests.model.windowed_checkpoints import WINDOW, check_greedy, checkpoint, write_gguf


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("smollm3"))
    # Untied (SmolLM3-3B ties): a random tied head mostly echoes the input token, and greedy tokens
    # would then not see whether a layer rotates.
    return path, checkpoint("SmolLM3Config", "SmolLM3ForCausalLM", path, tie_word_embeddings=False)


def test_nope_layers_skip_rope(smollm3):
    path, hf = smollm3
    loaded = load_model(path)
    assert loaded.architecture == "SmolLM3ForCausalLM"
    assert hf.config.no_rope_layers == [1, 1, 1, 0]
    ropes = [type(l.self_attn.rotary_emb).__name__ for l in loaded.model.model.layers]
    assert ropes == ["RotaryEmbedding"] * 3 + ["NoRope"]


def test_safetensors_greedy_matches_hf(smollm3):
    path, hf = smollm3
    check_greedy(path, hf, "smollm3")


def test_gguf_greedy_matches_hf(smollm3, tmp_path):
    path, hf = smollm3
    check_greedy(write_gguf(hf, path, str(tmp_path / "f32.gguf"), "smollm3"), hf, "smollm3 gguf")


def test_windowed_nope_layers_match_hf(tmp_path):
    hf = checkpoint(
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        str(tmp_path),
        use_sliding_window=True,
        sliding_window=WINDOW,
        tie_word_embeddings=False,
    )
    assert hf.config.layer_types[3] == "sliding_attention"
    check_greedy(str(tmp_path), hf, "smollm3 windowed")
