"""Falcon-H1 (FalconH1ForCausalLM: attention and Mamba-2 side by side in every layer, muP
multipliers) end to end against HF transformers in float32: the prompt's log-probs through the KV
and state pools, greedy tokens alone / batched / in prefill chunks smaller than the prompt (near-tie
rule), and a second turn reusing the first one's cached prefix (a state snapshot). Other checkpoints
cover the mixer's other gated norms: none (y * silu(z)) and norm before the gate. The same weights
as llama.cpp's falcon-h1 GGUF (float32, every multiplier folded into the weights) answer alike; its
Q8_0 file (folded, then rounded) agrees with HF holding what the file stores."""

from __future__ import annotations

import random

import pytest
import torch

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.hybrid.mamba2_gguf_writer import falcon_h1_as_stored, write_falcon_h1_gguf
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.model.top1_agreement import top1_agreement

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


@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
def test_gguf_weights_equal_the_folded_rounded_checkpoint(falcon, tmp_path, qtype):
    """Every tensor radixlm's loader reads from the file (Q8_0 blocks dequantized) equals HF's
    weight with its multipliers folded in, then rounded as the file stores it
    (falcon_h1_as_stored), under the names the model loads: the fold's rows (in_proj's z / x / B /
    C / dt parts) and the rounding blocks line up with the weights they scale."""
    from radixlm.model.gguf.loader import gguf_config, gguf_weights
    from radixlm.model.gguf.reader import open_gguf
    from radixlm.model.layers.quantized import QuantizedTensor

    _, hf, _, path = falcon
    reader = open_gguf(write_falcon_h1_gguf(path, str(tmp_path / "h1.gguf"), qtype))
    config = gguf_config(reader)
    got = dict(gguf_weights(reader, config, keep_quantized=True))
    want = falcon_h1_as_stored(hf, qtype).state_dict()
    assert sorted(got) == sorted(want)
    quantized = 0
    for name, t in want.items():
        w = got[name]
        if isinstance(w, QuantizedTensor):
            quantized += 1
            w = w.dequantize()
        if name.endswith("A_log"):  # stored as -exp(A_log): log(-a) is A_log to float32's nearest
            torch.testing.assert_close(w, t, rtol=1e-6, atol=0, msg=name)
        else:
            assert torch.equal(w.float().reshape(t.shape), t), name
    # Q8_0: in_proj, out_proj, q, k, v, o, gate, up, down of 4 layers; token_embd, output
    assert quantized == (4 * 9 + 2 if qtype == "q8_0" else 0)


def test_q8_0_gguf_agrees_with_hf_top1(falcon, tmp_path):
    """llama.cpp's Q8_0 file on the native kernels: top-1 agreement with HF holding what the file
    stores (every multiplier folded into the weights, then rounded) >= 95% along HF's greedy text,
    as tests/hybrid/test_hybrid_gguf.py asks of the other hybrids. Three texts: the first one's
    greedy text ends at EOS after 4 tokens (441 positions in all)."""
    _, hf, _, path = falcon
    q8 = write_falcon_h1_gguf(path, str(tmp_path / "falcon-h1-q8_0.gguf"), qtype="q8_0")
    held = falcon_h1_as_stored(hf, "q8_0")
    agree, total = top1_agreement(q8, hf, held, mh.VOCAB, new_tokens=160, seqs=3)
    assert total > 400
    assert agree / total >= 0.95, f"falcon-h1 Q8_0: top-1 agreement {agree}/{total}"
