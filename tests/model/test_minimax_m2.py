"""MiniMax-M2 (MiniMaxM2ForCausalLM) against transformers on a tiny random float32 checkpoint:
hidden 64, 2 layers (both MoE), 8 experts of width 32, top-3 sigmoid routing with a drawn
e_score_correction_bias, q/k norms over the whole projections, partial RoPE (rotary_dim 8 of
head_dim 16). HF's greedy tokens alone, batched and in prefill chunks smaller than the prompt,
from MiniMax's own checkpoint names and from the `minimax-m2` GGUF llama.cpp's converter writes;
the radix cache exact (reuse, branch, eviction); a Q8_0 file's top-1 agreement with HF >= 95%."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from radixlm.model.layers.moe.deepseek_routing import TopkMethod
from radixlm.model.loader import load_model
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.moe_families import OlmoeAttention
from tests.model.moe_family_checkpoints import hf_holding, moe_checkpoint, write_moe_gguf
from tests.model.radix_cache_checks import check_cached_prefixes, check_eviction
from tests.model.top1_agreement import top1_agreement
from tests.model.windowed_checkpoints import VOCAB, check_greedy

FAMILY = "minimax_m2"


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    path = str(tmp_path_factory.mktemp(FAMILY))
    return path, moe_checkpoint(FAMILY, path)


def test_structure_and_safetensors_greedy_matches_hf(minimax):
    path, hf = minimax
    loaded = load_model(path, quantization="none")
    assert loaded.architecture == "MiniMaxM2ForCausalLM"
    layers = loaded.model.model.layers
    assert all(isinstance(layer.mlp, DeepseekMoE) for layer in layers)
    routing = layers[0].mlp.routing
    assert (routing.method, routing.n_group, routing.top_k, routing.norm_topk_prob) == (
        TopkMethod.NOAUX_TC,
        1,
        3,
        True,
    )
    assert routing.routed_scaling_factor == 1.0 and layers[0].mlp.shared_experts is None
    attn = layers[0].self_attn
    assert isinstance(attn, OlmoeAttention) and attn.rotary_emb.rotary_dim == 8
    del loaded
    check_greedy(path, hf, FAMILY)


@pytest.mark.parametrize(
    "key, value",
    [("qk_norm_type", "per_head"), ("hidden_act", "gelu"), ("shared_intermediate_size", 64)],
)
def test_unsupported_variants_are_refused(minimax, tmp_path, key, value):
    path, _ = minimax
    for name in os.listdir(path):
        shutil.copy(os.path.join(path, name), tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    cfg[key] = value
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match=f"minimax_m2: {key} "):
        load_model(str(tmp_path), quantization="none")


def test_gguf_greedy_matches_hf(minimax, tmp_path):
    path, hf = minimax
    gguf_path = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "f32.gguf"))
    loaded = load_model(gguf_path, quantization="none")
    assert loaded.architecture == "MiniMaxM2ForCausalLM"
    cfg, ref = loaded.hf_config, hf.config
    for key in ("num_hidden_layers", "head_dim", "intermediate_size", "num_local_experts"):
        assert getattr(cfg, key) == getattr(ref, key), key
    assert cfg.num_experts_per_tok == ref.num_experts_per_tok
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5
    del loaded
    check_greedy(gguf_path, hf, f"{FAMILY} gguf")


def test_radix_cache_stays_exact(minimax):
    path, hf = minimax
    check_cached_prefixes(path, hf, FAMILY)
    check_eviction(path, hf, FAMILY)


def test_q8_0_gguf_agrees_with_hf_top1(minimax, tmp_path):
    path, hf = minimax
    q8 = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "q8_0.gguf"), "q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), VOCAB, new_tokens=120)
    print(f"{FAMILY} Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{FAMILY} Q8_0: top-1 agreement {agree}/{total}"
