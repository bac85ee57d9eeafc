"""gpt-oss end to end from HF safetensors (float32), and llama.cpp's GGUF of it: attention sinks,
biases on q/k/v/o, sliding and full layers alternating, YaRN RoPE, a biased top-k router and
biased experts with the clamped SwiGLU. Logits equal transformers' through the pools (prefill,
decode, an extend over a shared prefix), and radixlm's greedy tokens are HF's (near-tie rule)
alone, batched and in prefill chunks smaller than the prompt; every prompt and answer crosses the
window. Auto runs it on the native attention kernel on CPU; the pools' logits are checked on both
the native and the torch backend."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.layers.attention import (
    AttentionBackendSpec,
    NativeCPUBackend,
    attention_features,
)
from radixlm.model.layers.attention.registry import resolve_attention_backend
from radixlm.model.loader import load_model, load_tokenizer
from tests.model.gpt_oss_checkpoint import check_logits, gpt_oss_checkpoint, write_gguf
from tests.model.helpers import PoolHarness
from tests.model.windowed_checkpoints import WINDOW, check_greedy


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gpt_oss"))
    return path, gpt_oss_checkpoint(path), load_model(path)


def test_layers_windows_and_sinks_as_hf(gpt_oss):
    path, hf, loaded = gpt_oss
    assert loaded.architecture == "GptOssForCausalLM"
    layers = loaded.model.model.layers
    assert [l.self_attn.attn.sliding_window_size for l in layers] == [WINDOW, None] * 2
    for ours, theirs in zip(layers, hf.model.layers):
        assert torch.equal(ours.self_attn.attn.sinks, theirs.self_attn.sinks)
        assert ours.self_attn.attn.sinks.dtype == torch.float32
    features = attention_features(loaded.model.modules())
    assert features == (WINDOW, 0.0, True, None)
    spec = AttentionBackendSpec(
        head_dim=16,
        dtype=torch.float32,
        kv_dtype=torch.float32,
        device=torch.device("cpu"),
        sliding_window_size=WINDOW,
        sinks=True,
    )
    assert resolve_attention_backend(None, spec) == "native"  # auto on CPU: windows and sinks
    assert resolve_attention_backend("torch", spec) == "torch"


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_logits_match_hf_through_the_pools(gpt_oss, backend):
    _, hf, loaded = gpt_oss
    attn = NativeCPUBackend() if backend == "native" else None  # None: the harness's torch SDPA
    check_logits(PoolHarness(loaded.model, hf.config, attn_backend=attn), hf)


def test_safetensors_greedy_matches_hf(gpt_oss):
    path, hf, _ = gpt_oss
    check_greedy(path, hf, "gpt-oss")


def test_gguf_is_the_hf_model(gpt_oss, tmp_path):
    """llama.cpp's GGUF of the model loads as HF's: the config in what the model reads, every
    parameter bit for bit (experts re-interleaved, sinks renamed), the logits, and the vocabulary
    (the tokenizer comes through transformers' GGUF reader, whose gpt-oss config parser fails).
    The same parameters under the same config run as the safetensors' do through the engine, so
    this file starts one engine only."""
    path, hf, loaded = gpt_oss
    gguf_path = write_gguf(hf, path, str(tmp_path / "f32.gguf"))
    from_gguf = load_model(gguf_path, quantization="none")
    cfg, ref = from_gguf.hf_config, hf.config
    assert cfg.architectures == ["GptOssForCausalLM"]
    assert cfg.layer_types == ref.layer_types and cfg.sliding_window == ref.sliding_window
    assert cfg.rope_parameters == ref.rope_parameters
    assert (cfg.num_local_experts, cfg.num_experts_per_tok) == (4, 2)
    ours = dict(from_gguf.model.named_parameters())
    for name, want in loaded.model.named_parameters():
        assert torch.equal(ours[name], want), name
    check_logits(PoolHarness(from_gguf.model, cfg), hf)
    text = "sinks take a share of attention"
    assert load_tokenizer(gguf_path).encode(text) == load_tokenizer(path).encode(text)
