"""Falcon-H1 (FalconH1ForCausalLM: attention and Mamba-2 side by side in every layer, muP
multipliers) end to end against HF transformers in float32: the prompt's log-probs through the KV
and state pools, greedy tokens alone / batched / in prefill chunks smaller than the prompt (near-tie
rule), and a second turn reusing the first one's cached prefix (a state snapshot). Other checkpoints
cover the mixer's other gated norms: none (y * silu(z)) and norm before the gate. The same weights
as llama.cpp's falcon-h1 GGUF (float32, every multiplier folded into the weights) answer alike."""

from __future__ import annotations

import random

import pytest

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.hybrid.mamba2_gguf_writer import write_falcon_h1_gguf
from tests.model.hybrid_checkpoints import tiny_tokenizer

ARCH = "FalconH1ForCausalLM"


@pytest.fixture(scope="module")
def falcon(tmp_path_factory):
    path, hf = mh.checkpoint(ARCH, str(tmp_path_factory.mktemp("falcon_h1")), tiny_tokenizer())
    with mh.engine(path) as engine:
        yield engine, hf, mh.reference(hf), path


def test_prompt_logprobs_equal_hf(falcon):
    engine, hf, _, _ = falcon
    assert engine.flush_cache()
    mh.assert_prompt_logprobs(engine, hf, mh.tokens(random.Random(0), 230), "falcon-h1")


def test_greedy_alone_batched_and_chunked(falcon):
    engine, _, ref, _ = falcon
    mh.check_greedy_alone_batched_and_chunked(engine, ref, "falcon-h1")


def test_second_turn_reuses_the_cached_prefix(falcon):
    engine, _, ref, _ = falcon
    mh.check_second_turn_reuses_the_cached_prefix(engine, ref, "falcon-h1")


@pytest.mark.parametrize(
    "norm",
    [
        {"mamba_rms_norm": False},  # HF's default: no norm, y * silu(z)
        {"mamba_rms_norm": True, "mamba_norm_before_gate": True},
    ],
    ids=["no-norm", "norm-before-gate"],
)
def test_other_gated_norms_equal_hf(norm, tmp_path):
    path, hf = mh.checkpoint(ARCH, str(tmp_path), tiny_tokenizer(), **norm)
    with mh.engine(path) as engine:
        ids = mh.tokens(random.Random(3), 230)
        mh.assert_prompt_logprobs(engine, hf, ids, f"falcon-h1 {norm}")


def test_float_gguf_equals_hf(falcon, tmp_path):
    """llama.cpp's falcon-h1 file of the same weights (float32; the multipliers folded into the
    weights round differently, well inside the tolerance): HF's log-probs and tokens."""
    _, hf, ref, path = falcon
    gguf_path = write_falcon_h1_gguf(path, str(tmp_path / "falcon-h1-f32.gguf"))
    with mh.engine(gguf_path) as engine:
        ids = mh.tokens(random.Random(4), 230)
        mh.assert_prompt_logprobs(engine, hf, ids, "falcon-h1 GGUF")
        sp = {"max_new_tokens": mh.NEW, "temperature": 0}
        out = engine.generate(input_ids=ids, sampling_params=sp)
        assert_greedy_equal(out["output_ids"], ref(ids), "falcon-h1 GGUF greedy")
