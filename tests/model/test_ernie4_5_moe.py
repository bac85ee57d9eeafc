"""ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM) against transformers on a tiny random float32
checkpoint: hidden 64, layer 0 dense, layers 1-2 MoE (8 experts, top 3, softmax scores, the
choice biased by a drawn e_score_correction_bias, renormalized) beside one shared expert, RoPE
over interleaved pairs. HF's greedy tokens alone, batched and in prefill chunks smaller than the
prompt, from safetensors and from the `ernie4_5-moe` GGUF llama.cpp's converter writes; the
radix cache exact (reuse, branch, eviction); a Q8_0 file's top-1 agreement with HF >= 95%; the
router against HF's; refusals by name."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from radixlm.model.layers.moe.moe_block import BiasedMoeBlock
from radixlm.model.layers.moe.topk import BiasedTopKRouting
from radixlm.model.loader import load_model
from radixlm.model.models.llama import LlamaMLP
from tests.model.cache_checks import check_cached_prefixes, check_eviction_through_a_small_pool
from tests.model.family_checks import with_config
from tests.model.moe_family_checkpoints import hf_holding, moe_checkpoint, write_moe_gguf
from tests.model.top1_agreement import top1_agreement
from tests.model.windowed_checkpoints import VOCAB, check_greedy

FAMILY = "ernie4_5_moe"


@pytest.fixture(scope="module")
def ernie(tmp_path_factory):
    path = str(tmp_path_factory.mktemp(FAMILY))
    return path, moe_checkpoint(FAMILY, path)


def test_structure_and_safetensors_greedy_matches_hf(ernie):
    path, hf = ernie
    loaded = load_model(path, quantization="none")
    assert loaded.architecture == "Ernie4_5_MoeForCausalLM"
    layers = loaded.model.model.layers
    assert isinstance(layers[0].mlp, LlamaMLP)
    for layer in layers[1:]:
        assert isinstance(layer.mlp, BiasedMoeBlock) and layer.mlp.shared_experts is not None
    want = hf.model.layers[1].mlp.gate.moe_statics.e_score_correction_bias.reshape(-1)
    assert torch.equal(layers[1].mlp.expert_bias, want)
    del loaded
    check_greedy(path, hf, FAMILY)


def test_gguf_greedy_matches_hf(ernie, tmp_path):
    path, hf = ernie
    gguf_path = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "f32.gguf"))
    loaded = load_model(gguf_path, quantization="none")
    assert loaded.architecture == "Ernie4_5_MoeForCausalLM"
    cfg, ref = loaded.hf_config, hf.config
    for key in (
        "num_hidden_layers",
        "intermediate_size",
        "moe_intermediate_size",
        "moe_num_experts",
        "moe_k",
        "moe_num_shared_experts",
        "moe_layer_start_index",
        "moe_layer_end_index",
        "moe_layer_interval",
        "use_bias",
    ):
        assert getattr(cfg, key) == getattr(ref, key), key
    del loaded
    check_greedy(gguf_path, hf, f"{FAMILY} gguf")


def test_radix_cache_stays_exact(ernie):
    path, hf = ernie
    check_cached_prefixes(path, hf, FAMILY)
    check_eviction_through_a_small_pool(path, hf, FAMILY)


def test_q8_0_gguf_agrees_with_hf_top1(ernie, tmp_path):
    path, hf = ernie
    q8 = write_moe_gguf(hf, FAMILY, path, str(tmp_path / "q8_0.gguf"), "q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), VOCAB, new_tokens=120)
    print(f"{FAMILY} Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{FAMILY} Q8_0: top-1 agreement {agree}/{total}"


def test_router_equals_hf(ernie):
    """HF's Ernie4_5_MoeTopKRouter (softmax, the bias for the choice only, renormalized over
    max(sum, moe_norm_min)): the same experts and weights."""
    _, hf = ernie
    router = hf.model.layers[1].mlp.gate
    x = torch.randn(64, hf.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, want_w, want_ids = router(x)
    bias = router.moe_statics.e_score_correction_bias.reshape(-1)
    routing = BiasedTopKRouting(3, "softmax", True, norm_min=hf.config.moe_norm_min)
    got_w, got_ids = routing.select(logits, bias)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (dict(moe_k=9), "ernie4_5_moe: moe_k 9"),
    ],
)
def test_unsupported_variants_are_refused(ernie, tmp_path, change, message):
    path, _ = ernie
    with pytest.raises(ValueError, match=message):
        load_model(with_config(path, tmp_path, **change), quantization="none")


def test_missing_tensor_is_named(ernie, tmp_path):
    """A checkpoint without layer 2's shared up projection: refused naming the parameter."""
    from safetensors.torch import load_file, save_file

    path, _ = ernie
    for f in os.listdir(path):
        if f != "model.safetensors":
            shutil.copy(os.path.join(path, f), tmp_path / f)
    tensors = load_file(f"{path}/model.safetensors")
    del tensors["model.layers.2.mlp.shared_experts.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.2\.mlp\.shared_experts"):
        load_model(str(tmp_path), quantization="none")
