"""LFM2-MoE (Lfm2MoeForCausalLM) beyond the hybrid suites (test_hybrid_engine.py,
test_hybrid_gguf.py and tests/model/test_gguf_hybrid_ssm.py run its default checkpoint: HF's greedy
tokens alone / batched / chunked, the radix cache's snapshots, the converter's float32 and Q8_0
`lfm2moe` files): the router against HF's own on every switch, a checkpoint with the other
switches (no expert bias, no renormalization, routed_scaling_factor 2.5, no dense layer) against
HF's log-probs and greedy tokens, and what is refused by name."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from radixlm.model.layers.moe.topk import BiasedTopKRouting
from radixlm.model.loader import load_model
from radixlm.model.registry import MODEL_REGISTRY
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.model.hybrid_checkpoints import CONFIGS, hybrid_checkpoint, tiny_tokenizer

ARCH = "Lfm2MoeForCausalLM"


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("norm", [True, False])
def test_router_equals_hf(use_bias, norm):
    """HF's Lfm2MoeTopKRouter: the same experts and weights (sigmoid, bias for the choice only,
    renormalized over sum + 1e-6, scaled)."""
    from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeTopKRouter

    cfg = transformers.Lfm2MoeConfig(
        hidden_size=64,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=norm,
        use_expert_bias=use_bias,
        routed_scaling_factor=2.5,
    )
    g = torch.Generator().manual_seed(0)
    router = Lfm2MoeTopKRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=g))
    bias = 0.1 * torch.randn(8, generator=g) if use_bias else None
    x = torch.randn(50, 64, generator=g)
    logits, want_w, want_ids = router(x, bias)
    routing = BiasedTopKRouting(3, "sigmoid", norm, norm_add=1e-6, scale=2.5)
    got_w, got_ids = routing.select(logits, bias)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def switched(tmp_path_factory):
    """A checkpoint with every MoE switch the default one leaves on turned the other way."""
    path, hf = hybrid_checkpoint(
        "lfm2moe",
        str(tmp_path_factory.mktemp("lfm2moe-switched")),
        use_expert_bias=False,
        norm_topk_prob=False,
        routed_scaling_factor=2.5,
        num_dense_layers=0,
        max_position_embeddings=2048,
    )
    return path, hf


def test_switched_checkpoint_equals_hf(switched):
    """A prompt's log-probs (prefilled in 100-token chunks) and a greedy answer: HF's."""
    from tests.e2e.test_default_model_greedy import assert_greedy_equal

    path, hf = switched
    rng = random.Random(0)
    with mh.engine(path) as engine:
        mh.assert_prompt_logprobs(engine, hf, mh.tokens(rng, 230), "lfm2moe switched")
        p = mh.tokens(rng, 150)
        out = engine.generate(
            input_ids=p, sampling_params={"max_new_tokens": mh.NEW, "temperature": 0}
        )
        assert_greedy_equal(out["output_ids"], mh.reference(hf)(p), "lfm2moe switched greedy")


def test_missing_expert_tensor_is_named(switched, tmp_path):
    """A checkpoint without one expert's down projection: refused naming that expert."""
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    path, _ = switched
    for f in os.listdir(path):
        if f != "model.safetensors":
            shutil.copy(os.path.join(path, f), tmp_path / f)
    tensors = load_file(f"{path}/model.safetensors")
    del tensors["model.layers.2.feed_forward.experts.5.w2.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['layer 2 expert 5 down_proj'\]"):
        load_model(str(tmp_path))


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(num_experts_per_tok=9), "num_experts_per_tok 9"),
        (dict(num_dense_layers=5), "num_dense_layers 5"),
        (dict(layer_types=["conv", "sliding_attention", "conv", "conv"]), r"layer_types\[1\]"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, field):
    cfg = transformers.Lfm2MoeConfig(**CONFIGS["lfm2moe"], vocab_size=len(tiny_tokenizer()))
    cfg.architectures = [ARCH]
    for k, v in change.items():  # set after HF's own checks: radixlm's refusal is what is tested
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=field):
        MODEL_REGISTRY.get(ARCH)(cfg)
