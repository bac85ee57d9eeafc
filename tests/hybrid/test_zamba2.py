"""Zamba2 (Zamba2ForCausalLM: Mamba-2 layers, some of them first running a shared transformer block
over concat(stream, embeddings) with per-invocation adapters and KV; models/zamba2.py) end to end
against HF transformers in float32: the prompt's log-probs through the KV and state pools, greedy
tokens alone / batched / in prefill chunks smaller than the prompt (near-tie rule), a second turn
reusing the first one's cached prefix (a state snapshot), evictions through a small pool. The main
checkpoint has 2 shared blocks over 3 hybrid layers (block 0 runs twice, each time with its own
adapters and KV), attention adapters and RoPE; others cover one block without attention adapters
(GQA, no RoPE, biases, silu), and untied blocks (tie_word_embeddings off: HF ties nothing).
Configs HF or radixlm cannot run are refused by name. llama.cpp's converter has no Zamba2: HF
safetensors only."""

from __future__ import annotations

import random

import pytest
import torch

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.model.cache_checks import check_eviction_through_a_small_pool
from tests.model.hybrid_checkpoints import tiny_tokenizer

ARCH = "Zamba2ForCausalLM"


def checkpoint(path: str, **changes):
    return mh.checkpoint(ARCH, path, tiny_tokenizer(), scaled_residual=True, **changes)


@pytest.fixture(scope="module")
def zamba2(tmp_path_factory):
    path, hf = checkpoint(str(tmp_path_factory.mktemp("zamba2")))
    with mh.engine(path) as engine:
        yield engine, hf, mh.reference(hf), path


def test_prompt_logprobs_equal_hf(zamba2):
    engine, hf, _, _ = zamba2
    assert engine.flush_cache()
    mh.assert_prompt_logprobs(engine, hf, mh.tokens(random.Random(0), 230), "zamba2")


def test_greedy_alone_batched_and_chunked(zamba2):
    engine, _, ref, _ = zamba2
    mh.check_greedy_alone_batched_and_chunked(engine, ref, "zamba2")


def test_second_turn_reuses_the_cached_prefix(zamba2):
    engine, _, ref, _ = zamba2
    mh.check_second_turn_reuses_the_cached_prefix(engine, ref, "zamba2")


def test_evictions_through_a_small_pool(zamba2):
    """Prompts sharing prefixes evict each other's KV and snapshots from a 200-token pool in
    32-token prefill chunks: still HF's tokens, every slot free at the end."""
    _, hf, _, path = zamba2
    check_eviction_through_a_small_pool(path, hf, "zamba2 small pool", max_mamba_cache_size=64)


@pytest.mark.parametrize(
    "changes",
    [
        {  # one block run by all three hybrid layers; no q / k / v adapters (the MLP's stay),
            # GQA, no RoPE, biases, silu
            "num_mem_blocks": 1,
            "use_shared_attention_adapter": False,
            "num_key_value_heads": 2,
            "use_mem_rope": False,
            "add_bias_linear": True,
            "hidden_act": "silu",
        },
        # HF ties nothing: every hybrid layer runs its own copy of its block
        {"tie_word_embeddings": False},
    ],
    ids=["one-block-no-attention-adapters", "untied"],
)
def test_other_configs_equal_hf(changes, tmp_path):
    path, hf = checkpoint(str(tmp_path), **changes)
    with mh.engine(path) as engine:
        rng = random.Random(3)
        mh.assert_prompt_logprobs(engine, hf, mh.tokens(rng, 230), f"zamba2 {changes}")
        ids = mh.tokens(rng, 40)
        out = engine.generate(
            input_ids=ids, sampling_params={"max_new_tokens": mh.NEW, "temperature": 0}
        )
        assert_greedy_equal(out["output_ids"], mh.reference(hf)(ids), f"zamba2 {changes}")


def test_untied_blocks_are_each_layers_own(tmp_path):
    """Untied, the file holds every hybrid layer's copy of its block (with the other invocations'
    adapter slots HF never runs): each copy loads into its own block, the unused slots nowhere."""
    from radixlm.model.registry import MODEL_REGISTRY

    hf = mh.hf_model(ARCH, tiny_tokenizer(), tie_word_embeddings=False)
    model = MODEL_REGISTRY.get(ARCH)(hf.config)
    model.load_weights(hf.state_dict().items())
    layers = hf.model.layers
    for n, i in enumerate((1, 3, 4)):
        ours = model.model.shared_blocks[n].self_attn.qkv_proj.weight
        theirs = layers[i].shared_transformer.self_attn.q_proj.weight
        assert torch.equal(ours[: theirs.shape[0]], theirs), f"hybrid layer {i}"
        adapter = layers[i].shared_transformer.feed_forward.gate_up_proj_adapter_list[n]
        assert torch.equal(model.model.layers[i].gate_up_adapter[1].weight, adapter[1].weight)


def test_every_copy_of_a_tied_block_loads(tmp_path):
    """A file with each tied block under every hybrid layer that runs it (state_dict's duplicate
    names) loads the same weights as save_pretrained's one copy."""
    from radixlm.model.registry import MODEL_REGISTRY

    hf = mh.hf_model(ARCH, tiny_tokenizer())
    names = [n for n in hf.state_dict() if ".layers.4.shared_transformer." in n]
    assert names  # layer 4 runs block 0 again: its names are the duplicates
    model = MODEL_REGISTRY.get(ARCH)(hf.config)
    model.load_weights(hf.state_dict().items())
    block = model.model.shared_blocks[0].feed_forward.gate_up_proj.weight
    assert torch.equal(
        block, hf.model.layers[1].shared_transformer.feed_forward.gate_up_proj.weight
    )
    assert len(model.model.shared_blocks) == 2


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(hidden_act="relu"), "hidden_act"),
        (dict(num_key_value_heads=2), "use_shared_attention_adapter"),
        (dict(mamba_ngroups=3), "mamba_ngroups"),
        (dict(n_mamba_heads=6), "n_mamba_heads"),
        (dict(num_mem_blocks=0), "num_mem_blocks"),
        (dict(layers_block_type=["linear_attention", "moe", "linear_attention"] + ["hybrid"] * 2),
         "layer_types"),
    ],
)  # fmt: skip
def test_unsupported_configs_are_refused_by_name(change, field):
    import transformers

    from radixlm.model.registry import MODEL_REGISTRY

    cfg = transformers.Zamba2Config(**mh.CONFIGS[ARCH], vocab_size=64)
    cfg.architectures = [ARCH]
    for k, v in change.items():  # set after HF's own checks: radixlm's refusal is what is tested
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=field):
        MODEL_REGISTRY.get(ARCH)(cfg)
