"""Granite-4.0-H (GraniteMoeHybridForCausalLM: Mamba-2 and attention layers, a MoE plus a shared
expert, muP multipliers) end to end against HF transformers in float32: the prompt's log-probs
through the KV and state pools, greedy tokens alone / batched / in prefill chunks smaller than the
prompt (near-tie rule), and a second turn reusing the first one's cached prefix (a state snapshot).
A second checkpoint covers the other switches: RoPE attention and dense layers (no experts). The
same weights as llama.cpp's granitehybrid GGUF (float32) answer alike."""

from __future__ import annotations

import random

import pytest
import torch

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.hybrid.mamba2_gguf_writer import write_granite_gguf
from tests.model.hybrid_checkpoints import dequantized_as_q8_0, tiny_tokenizer
from tests.model.top1_agreement import top1_agreement

ARCH = "GraniteMoeHybridForCausalLM"


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    path, hf = mh.checkpoint(ARCH, str(tmp_path_factory.mktemp("granite")), tiny_tokenizer())
    with mh.engine(path) as engine:
        yield engine, hf, mh.reference(hf), path


def test_prompt_logprobs_equal_hf(granite):
    engine, hf, _, _ = granite
    assert engine.flush_cache()
    mh.assert_prompt_logprobs(engine, hf, mh.tokens(random.Random(0), 230), "granite")


def test_greedy_alone_batched_and_chunked(granite):
    engine, _, ref, _ = granite
    mh.check_greedy_alone_batched_and_chunked(engine, ref, "granite")


def test_second_turn_reuses_the_cached_prefix(granite):
    engine, _, ref, _ = granite
    mh.check_second_turn_reuses_the_cached_prefix(engine, ref, "granite")


def test_rope_and_dense_layers_equal_hf(tmp_path):
    """position_embedding_type "rope" and num_local_experts 0 (the shared MLP alone)."""
    path, hf = mh.checkpoint(
        ARCH,
        str(tmp_path),
        tiny_tokenizer(),
        position_embedding_type="rope",
        num_local_experts=0,
        layer_types=["mamba", "attention", "mamba", "attention"],
    )
    with mh.engine(path) as engine:
        ids = mh.tokens(random.Random(3), 230)
        mh.assert_prompt_logprobs(engine, hf, ids, "granite rope dense")


def test_float_gguf_equals_hf(granite, tmp_path):
    """llama.cpp's granitehybrid file of the same weights (float32): HF's log-probs and tokens."""
    _, hf, ref, path = granite
    gguf_path = write_granite_gguf(path, str(tmp_path / "granite-f32.gguf"))
    with mh.engine(gguf_path) as engine:
        ids = mh.tokens(random.Random(4), 230)
        mh.assert_prompt_logprobs(engine, hf, ids, "granite GGUF")
        out = engine.generate(
            input_ids=ids, sampling_params={"max_new_tokens": mh.NEW, "temperature": 0}
        )
        assert_greedy_equal(out["output_ids"], ref(ids), "granite GGUF greedy")


def test_gguf_weights_equal_the_checkpoint(granite, tmp_path):
    """Every tensor read back from the GGUF equals the checkpoint's (q / k unpermuted: without
    RoPE a wrong permutation would not show in the logits), under the names the model loads."""
    from safetensors.torch import load_file

    from radixlm.model.gguf.loader import gguf_config, gguf_weights
    from radixlm.model.gguf.reader import open_gguf

    path = granite[3]
    reader = open_gguf(write_granite_gguf(path, str(tmp_path / "f32.gguf")))
    got = dict(gguf_weights(reader, gguf_config(reader)))
    want = {}
    for name, t in load_file(f"{path}/model.safetensors").items():
        base, _, _ = name.rpartition(".block_sparse_moe.")
        if name.endswith("block_sparse_moe.input_linear.weight"):
            gate, up = t.chunk(2, dim=1)
            want[f"{base}.mlp.experts.gate_proj.weight"] = gate
            want[f"{base}.mlp.experts.up_proj.weight"] = up
        elif name.endswith("block_sparse_moe.output_linear.weight"):
            want[f"{base}.mlp.experts.down_proj.weight"] = t
        elif name.endswith("block_sparse_moe.router.layer.weight"):
            want[f"{base}.mlp.gate.weight"] = t
        elif name.endswith("shared_mlp.input_linear.weight"):
            gate, up = t.chunk(2, dim=0)
            want[name.replace("input_linear", "gate_proj")] = gate
            want[name.replace("input_linear", "up_proj")] = up
        else:
            want[name.replace("shared_mlp.output_linear", "shared_mlp.down_proj")] = t
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        if name.endswith("A_log"):  # stored as -exp(A_log): log(-a) is A_log to float32's nearest
            torch.testing.assert_close(got[name], t, rtol=1e-6, atol=0, msg=name)
        else:
            assert torch.equal(got[name].float(), t.float()), name


def test_q8_0_gguf_agrees_with_hf_top1(granite, tmp_path):
    """llama.cpp's Q8_0 file on the native kernels: top-1 agreement with HF holding the file's
    dequantized weights (the router kept float32, as the converter keeps it) >= 95% along HF's
    greedy text, as tests/hybrid/test_hybrid_gguf.py asks of the other hybrids (measured 395/398;
    with float activations, 398/398: the reference is the file's weights exactly)."""
    _, hf, _, path = granite
    q8 = write_granite_gguf(path, str(tmp_path / "granite-q8_0.gguf"), qtype="q8_0")
    held = dequantized_as_q8_0(hf, kept_float=("router.weight",))
    agree, total = top1_agreement(q8, hf, held, mh.VOCAB, new_tokens=160)
    assert agree / total >= 0.95, f"granitehybrid Q8_0: top-1 agreement {agree}/{total}"
