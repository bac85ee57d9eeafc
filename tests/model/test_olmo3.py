"""OLMo 3 end to end: q/k norms over the whole projections, post-norms only, sliding windows on
three of four layers, a RoPE per layer type. radixlm's greedy tokens are HF transformers' (float32,
near-tie rule) from safetensors and from the GGUF llama.cpp's converter writes (arch olmo2 with a
sliding window and its per-layer pattern), alone, batched and in prefill chunks smaller than the
prompt; every prompt and answer crosses the window. Auto runs it on the native attention kernel on
CPU (safetensors); the GGUF check runs the torch backend."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.layers.attention import AttentionBackendSpec, attention_features
from radixlm.model.layers.attention.registry import resolve_attention_backend
from radixlm.model.loader import load_model
from tests.model.windowed_checkpoints import WINDOW, check_greedy, checkpoint, write_gguf


@pytest.fixture(scope="module")
def olmo3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("olmo3"))
    hf = checkpoint(
        "Olmo3Config",
        "Olmo3ForCausalLM",
        path,
        sliding_window=WINDOW,
        rope_parameters={  # long-context OLMo 3: YaRN on the full-attention layers only
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 50_000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 128,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )
    return path, hf


def test_layers_are_windowed_as_hf(olmo3):
    path, hf = olmo3
    loaded = load_model(path)
    assert loaded.architecture == "Olmo3ForCausalLM"
    windows = [l.self_attn.attn.sliding_window_size for l in loaded.model.model.layers]
    assert hf.config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    assert windows == [WINDOW] * 3 + [None]
    window, cap, sinks, _ = attention_features(loaded.model.modules())
    spec = AttentionBackendSpec(
        head_dim=loaded.model.model.layers[0].self_attn.attn.head_dim,
        dtype=torch.float32,
        kv_dtype=torch.float32,
        device=torch.device("cpu"),
        sliding_window_size=window,
        logit_cap=cap,
        sinks=sinks,
    )
    assert resolve_attention_backend(None, spec) == "native"  # auto on CPU runs the windows


def test_safetensors_greedy_matches_hf(olmo3):
    path, hf = olmo3
    check_greedy(path, hf, "olmo3")  # auto: the native kernel


def test_gguf_greedy_matches_hf(olmo3, tmp_path):
    """The same weights from GGUF, on the torch backend (both backends' windows against HF)."""
    path, hf = olmo3
    gguf_path = write_gguf(hf, path, str(tmp_path / "f32.gguf"), "olmo2")
    check_greedy(gguf_path, hf, "olmo3 gguf", attention_backend="torch")
