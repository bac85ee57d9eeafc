"""Hunyuan-A13B (HunYuanMoEV1ForCausalLM) against transformers on a tiny random float32
checkpoint: hidden 64, 2 layers (both MoE), 8 experts of width 32, top-3 softmax routing
renormalized, a shared MLP, per-head q/k norms after RoPE, q/k/v/o biases, the released NTK-alpha
RoPE (alpha 1000). HF's greedy tokens alone, batched and in prefill chunks smaller than the
prompt, from safetensors and from the `hunyuan-moe` GGUF llama.cpp's converter writes (the
scaled base); the radix cache exact (reuse, branch, eviction); a Q8_0 file's top-1 agreement
with HF >= 95%."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from radixlm.model.layers.moe.deepseek_routing import TopkMethod
from radixlm.model.loader import load_model
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.hunyuan_moe import HunYuanAttention
from tests.model.moe_family_checkpoints import hf_holding, moe_checkpoint, write_moe_gguf
from tests.model.radix_cache_checks import check_cached_prefixes, check_eviction
from tests.model.top1_agreement import top1_agreement
from tests.model.windowed_checkpoints import VOCAB, check_greedy

FAMILY = "hunyuan_moe"


@pytest.fixture(scope="module")
def hunyuan(tmp_path_factory):
    path = str(tmp_path_factory.mktemp(FAMILY))
    return path, moe_checkpoint(FAMILY, path)


def test_structure_and_safetensors_greedy_matches_hf(hunyuan):
    path, hf = hunyuan
    loaded = load_model(path, quantization="none")
    assert loaded.architecture == "HunYuanMoEV1ForCausalLM"
    layers = loaded.model.model.layers
    assert all(isinstance(layer.mlp, DeepseekMoE) for layer in layers)
    routing = layers[0].mlp.routing
    assert (routing.method, routing.top_k, routing.norm_topk_prob) == (
        TopkMethod.GREEDY,
        3,
        True,
    )
    assert layers[0].mlp.shared_experts is not None
    attn = layers[0].self_attn
    assert isinstance(attn, HunYuanAttention) and attn.o_proj.bias is not None
    del loaded
    check_greedy(path, hf, FAMILY)


@pytest.mark.parametrize(
    "key, value",
    [
        ("use_cla", True),
        ("moe_topk", [3, 2]),
        ("moe_intermediate_size", [64, 64]),
        ("num_shared_expert", [2, 2]),
        ("hidden_act", "gelu"),
    ],
)
def test_unsupported_variants_are_refused(hunyuan, tmp_path, key, value):
    path, _ = hunyuan
    for name in os.listdir(path):
        shutil.copy(os.path.join(path, name), tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    cfg[key] = value
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match=f"hunyuan_v1_moe: {key} "):
        load_model(str(tmp_path), quantization="none")


def test_gguf_greedy_matches_hf(hunyuan, tmp_path):
    path, hf = hunyuan
    gguf_path = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "f32.gguf"))
    loaded = load_model(gguf_path, quantization="none")
    assert loaded.architecture == "HunYuanMoEV1ForCausalLM"
    cfg, ref = loaded.hf_config, hf.config
    for key in ("num_hidden_layers", "head_dim", "intermediate_size", "num_experts", "moe_topk"):
        assert getattr(cfg, key) == getattr(ref, key), key
    assert cfg.attention_bias
    del loaded
    check_greedy(gguf_path, hf, f"{FAMILY} gguf")


def test_radix_cache_stays_exact(hunyuan):
    path, hf = hunyuan
    check_cached_prefixes(path, hf, FAMILY)
    check_eviction(path, hf, FAMILY)


def test_q8_0_gguf_agrees_with_hf_top1(hunyuan, tmp_path):
    path, hf = hunyuan
    q8 = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "q8_0.gguf"), "q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), VOCAB, new_tokens=120)
    print(f"{FAMILY} Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{FAMILY} Q8_0: top-1 agreement {agree}/{total}"
