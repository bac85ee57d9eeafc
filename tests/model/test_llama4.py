"""Llama 4's text model (issue 64) from HF safetensors against transformers in float32: chunked
attention on the RoPE layers (chunks of 8 positions, so every prompt and answer crosses several),
a NoPE global layer with attention temperature tuning (floor_scale 4: it scales from position 3
on), L2 q/k norms, interleaved RoPE pairs, the top-1 sigmoid-scaled-input experts with a shared
expert on the MoE layers and a dense MLP on the others; greedy tokens (near-tie rule) alone,
batched and in prefill chunks, on the native kernel's chunked attention."""

from __future__ import annotations

import pytest

from radixlm.model.layers.attention import attention_features
from radixlm.model.loader import load_model
from tests.model.windowed_checkpoints import check_greedy, checkpoint

CHUNK = 8


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama4"))
    hf = checkpoint(
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        path,
        head_dim=16,
        intermediate_size=64,  # an expert's
        intermediate_size_mlp=128,  # the dense layers'
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,  # MoE in layers 1 and 3, dense in 0 and 2
        attention_chunk_size=CHUNK,
        use_qk_norm=True,
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.1,
        tie_word_embeddings=False,
    )
    return path, hf


def test_layers_are_llama4s(llama4):
    path, hf = llama4
    assert hf.config.no_rope_layers == [1, 1, 1, 0] and hf.config.moe_layers == [1, 3]
    loaded = load_model(path)
    layers = loaded.model.model.layers
    assert [l.self_attn.attn.attention_chunk_size for l in layers] == [CHUNK] * 3 + [None]
    assert [l.self_attn.use_rope for l in layers] == [True, True, True, False]
    features = attention_features(loaded.model.modules())
    assert features.attention_chunk_size == CHUNK and features.sliding_window_size is None


def test_safetensors_greedy_matches_hf(llama4):
    path, hf = llama4
    check_greedy(path, hf, "llama4")


def test_the_released_multimodal_layout_serves_its_text_model(llama4, tmp_path):
    """Scout / Maverick ship as Llama4ForConditionalGeneration: the same language model under
    `language_model.` beside a vision tower, which the text model skips."""
    import shutil
    from pathlib import Path

    import transformers

    path, hf = llama4
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
    )
    cfg = transformers.Llama4Config(text_config=hf.config.to_dict(), vision_config=vision)
    mm = transformers.Llama4ForConditionalGeneration(cfg)  # float32: the default dtype
    mm.language_model.load_state_dict(hf.state_dict())
    out = tmp_path / "mm"
    mm.save_pretrained(out)
    for f in Path(path).iterdir():  # the tiny tokenizer
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    check_greedy(str(out), hf, "llama4 multimodal checkpoint")
