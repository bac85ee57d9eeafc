"""Hunyuan dense (HunYuanDenseV1ForCausalLM: Llama with per-head q/k norms after RoPE, the
NTK-alpha RoPE of the released configs) against HF: greedy tokens from the safetensors and from
llama.cpp's `hunyuan-dense` GGUF (the stretched base as its rope.freq_base, context 256k), the
radix cache exact, quantized GGUFs' top-1."""

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

# Hunyuan-4B's rope_scaling (max_position_embeddings 32k: the converter's assumption)
ROPE = {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}
CONTEXT = 256 * 1024


def hparams(hp: dict) -> dict:
    """HunYuanModel.set_gguf_parameters: the stretched base, context 256k."""
    rope, dim = hp["rope_parameters"], hp["head_dim"]
    base = rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2))
    return dict(
        hp,
        rope_parameters={"rope_type": "default", "rope_theta": base},
        max_position_embeddings=CONTEXT,
    )


def header(w, hf) -> None:
    import gguf

    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_rope_scaling_factor(1)
    w.add_rope_scaling_orig_ctx_len(CONTEXT)


@pytest.fixture(scope="module")
def hunyuan(tmp_path_factory):
    return family_checkpoint(
        tmp_path_factory,
        "HunYuanDenseV1Config",
        "HunYuanDenseV1ForCausalLM",
        rope_parameters=ROPE,
        max_position_embeddings=32 * 1024,
    )


def test_safetensors_and_gguf_greedy_match_hf(hunyuan, tmp_path):
    path, hf = hunyuan
    assert load_model(path).architecture == "HunYuanDenseV1ForCausalLM"
    check_greedy(path, hf, "hunyuan")
    gguf_path = str(tmp_path / "f32.gguf")
    check_gguf_greedy(path, hf, gguf_path, "hunyuan-dense", "hunyuan", header, hparams)


def test_radix_cache_stays_exact(hunyuan):
    path, hf = hunyuan
    check_cached_prefixes(path, hf, "hunyuan")
    check_eviction_through_a_small_pool(path, hf, "hunyuan", swa_full_tokens_ratio=0.5)


def test_quantized_gguf_top1(hunyuan, tmp_path):
    path, hf = hunyuan
    check_quantized_top1(path, hf, tmp_path, "hunyuan-dense", "hunyuan", header, hparams)


def test_other_activation_refused_by_field(hunyuan, tmp_path):
    path, _ = hunyuan
    with pytest.raises(ValueError, match="HunYuanDenseV1ForCausalLM hidden_act 'gelu'"):
        load_model(with_config(path, tmp_path, hidden_act="gelu"))
