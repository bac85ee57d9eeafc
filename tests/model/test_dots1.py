"""dots.llm1 (Dots1ForCausalLM) against transformers on a tiny random float32 checkpoint: hidden
64, 3 layers (the first dense: first_k_dense_replace 1), 8 routed experts in 2 groups (topk_group
1), top-3 sigmoid routing with a drawn e_score_correction_bias, renormalized and scaled by 2.5, one
shared expert, per-head q/k norms. HF's greedy tokens alone, batched and in prefill chunks smaller
than the prompt, from safetensors and from the `dots1` GGUF llama.cpp's converter writes; the
radix cache exact (reuse, branch, eviction); a Q8_0 file's top-1 agreement with HF >= 95%."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from radixlm.model.layers.moe.deepseek_routing import TopkMethod
from radixlm.model.loader import load_model
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.llama import LlamaMLP
from tests.model.moe_family_checkpoints import hf_holding, moe_checkpoint, write_moe_gguf
from tests.model.radix_cache_checks import check_cached_prefixes, check_eviction
from tests.model.top1_agreement import top1_agreement
from tests.model.windowed_checkpoints import VOCAB, check_greedy

FAMILY = "dots1"


@pytest.fixture(scope="module")
def dots1(tmp_path_factory):
    path = str(tmp_path_factory.mktemp(FAMILY))
    return path, moe_checkpoint(FAMILY, path)


def test_structure_and_safetensors_greedy_matches_hf(dots1):
    path, hf = dots1
    loaded = load_model(path, quantization="none")
    assert loaded.architecture == "Dots1ForCausalLM"
    layers = loaded.model.model.layers
    assert type(layers[0].mlp) is LlamaMLP
    assert all(isinstance(layer.mlp, DeepseekMoE) for layer in layers[1:])
    routing = layers[1].mlp.routing
    assert (routing.method, routing.n_group, routing.topk_group, routing.top_k) == (
        TopkMethod.NOAUX_TC,
        2,
        1,
        3,
    )
    assert (routing.norm_topk_prob, routing.routed_scaling_factor) == (True, 2.5)
    attn = layers[0].self_attn
    assert attn.qk_norm and attn.rotary_emb.rotary_dim == 16
    assert layers[1].mlp.shared_experts is not None
    del loaded
    check_greedy(path, hf, FAMILY)


@pytest.mark.parametrize(
    "key, value",
    [
        ("layer_types", ["full_attention", "sliding_attention", "full_attention"]),
        ("hidden_act", "gelu"),
    ],
)
def test_unsupported_variants_are_refused(dots1, tmp_path, key, value):
    path, _ = dots1
    for name in os.listdir(path):
        shutil.copy(os.path.join(path, name), tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    cfg[key] = value
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match=f"dots1: {key} "):
        load_model(str(tmp_path), quantization="none")


def test_gguf_greedy_matches_hf(dots1, tmp_path):
    path, hf = dots1
    gguf_path = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "f32.gguf"))
    loaded = load_model(gguf_path, quantization="none")
    assert loaded.architecture == "Dots1ForCausalLM"
    cfg, ref = loaded.hf_config, hf.config
    for key in (
        "num_hidden_layers",
        "attention_bias",
        "first_k_dense_replace",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "n_group",
        "topk_group",
        "norm_topk_prob",
        "routed_scaling_factor",
    ):
        assert getattr(cfg, key) == getattr(ref, key), key
    del loaded
    check_greedy(gguf_path, hf, f"{FAMILY} gguf")


def test_radix_cache_stays_exact(dots1):
    path, hf = dots1
    check_cached_prefixes(path, hf, FAMILY)
    check_eviction(path, hf, FAMILY)


def test_q8_0_gguf_agrees_with_hf_top1(dots1, tmp_path):
    path, hf = dots1
    q8 = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "q8_0.gguf"), "q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), VOCAB, new_tokens=120)
    print(f"{FAMILY} Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{FAMILY} Q8_0: top-1 agreement {agree}/{total}"
