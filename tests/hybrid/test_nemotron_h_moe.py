"""Nemotron-H with MoE blocks (Nemotron-3 Nano 30B-A3B's architecture: Mamba-2, attention and MoE
blocks, M E * M E M) end to end against HF transformers' NemotronHForCausalLM in float32: the
prompt's log-probs through the KV and state pools, greedy tokens alone / batched / in prefill
chunks smaller than the prompt (near-tie rule), a second turn reusing the first one's cached
prefix. The router's every switch is on: grouped top-k (4 groups, 2 eligible), a random
e_score_correction_bias, norm_topk_prob, routed_scaling_factor 2.5.

And llama.cpp's nemotron_h_moe GGUF, written as its converter writes it
(tests/model/ssm_gguf_writer.py): float32 answers HF's greedy tokens; Q8_0 agrees with HF holding
the file's weights at >= 95% of top-1 positions. The converter does not write topk_group (llama.cpp
routes without groups), so these checkpoints have one group, as Nemotron-3 Nano has. Nemotron 3
Super's latent projections (moe_latent_size: the routed experts in a smaller space) from HF's
checkpoint and from the GGUF."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.hybrid.test_hybrid_gguf import hf_holding
from tests.model.hybrid_checkpoints import hf_model, tiny_tokenizer, write_gguf
from tests.model.top1_agreement import top1_agreement

MOE = dict(
    layers_block_type=[
        "linear_attention",
        "moe",
        "full_attention",
        "linear_attention",
        "moe",
        "linear_attention",
    ],
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=48,
    n_shared_experts=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    max_position_embeddings=2048,
)


def checkpoint(path: str, tokenizer, scaled_residual: bool = False, **changes):
    """(path, hf): a random MoE Nemotron-H saved beside the tiny tokenizer; the correction bias
    (a buffer HF leaves at 0) drawn too, so that it changes some choices."""
    hf = hf_model("nemotron_h", tokenizer, scaled_residual=scaled_residual, **{**MOE, **changes})
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.1 * torch.randn(b.shape, generator=g)).bfloat16().float())
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    path, hf = checkpoint(
        str(tmp_path_factory.mktemp("nemotron-moe")), tiny_tokenizer(), n_group=4, topk_group=2
    )
    with mh.engine(path) as engine:
        yield engine, hf, mh.reference(hf)


def test_prompt_logprobs_equal_hf(nemotron):
    engine, hf, _ = nemotron
    assert engine.flush_cache()
    mh.assert_prompt_logprobs(engine, hf, mh.tokens(random.Random(0), 230), "nemotron-h moe")


def test_greedy_alone_batched_and_chunked(nemotron):
    engine, _, ref = nemotron
    mh.check_greedy_alone_batched_and_chunked(engine, ref, "nemotron-h moe")


def test_second_turn_reuses_the_cached_prefix(nemotron):
    engine, _, ref = nemotron
    mh.check_second_turn_reuses_the_cached_prefix(engine, ref, "nemotron-h moe")


def test_float_gguf_answers_hf_tokens(tmp_path):
    path, hf = checkpoint(str(tmp_path / "hf"), tiny_tokenizer())
    f32 = write_gguf(hf, path, str(tmp_path / "f32.gguf"))
    ref = mh.reference(hf)
    rng = random.Random(3)
    with Engine(
        model_path=f32,
        quantization="none",
        enable_invariant_checks=True,
        chunked_prefill_size=64,
        log_level="warning",
    ) as engine:
        for i, p in enumerate([mh.tokens(rng, 9), mh.tokens(rng, 150)]):
            out = engine.generate(
                input_ids=p, sampling_params={"max_new_tokens": mh.NEW, "temperature": 0}
            )
            assert_greedy_equal(out["output_ids"], ref(p), f"nemotron_h_moe GGUF f32 #{i}")


def test_q8_0_gguf_agrees_with_hf_top1(tmp_path):
    """GPT-2's scaled residual init, as the other MoE hybrids' Q8_0 tests (test_hybrid_gguf.py)."""
    path, hf = checkpoint(str(tmp_path / "hf"), tiny_tokenizer(), scaled_residual=True)
    q8 = write_gguf(hf, path, str(tmp_path / "q8_0.gguf"), qtype="q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), mh.VOCAB, new_tokens=160)
    assert agree / total >= 0.95, f"nemotron_h_moe Q8_0: top-1 agreement {agree}/{total}"


def test_latent_experts_equal_hf(tmp_path):
    """moe_latent_size 32 (hidden 64): the prompt's log-probs from the HF checkpoint, and the float
    GGUF's greedy tokens (ffn_latent_down / ffn_latent_up)."""
    path, hf = checkpoint(str(tmp_path / "hf"), tiny_tokenizer(), moe_latent_size=32)
    rng = random.Random(6)
    with mh.engine(path) as engine:
        mh.assert_prompt_logprobs(engine, hf, mh.tokens(rng, 150), "nemotron-h latent moe")
    f32 = write_gguf(hf, path, str(tmp_path / "f32.gguf"))
    p = mh.tokens(rng, 120)
    with mh.engine(f32) as engine:
        out = engine.generate(
            input_ids=p, sampling_params={"max_new_tokens": mh.NEW, "temperature": 0}
        )
    assert_greedy_equal(out["output_ids"], mh.reference(hf)(p), "nemotron_h_moe latent GGUF")
