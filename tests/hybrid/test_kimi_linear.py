"""Kimi-Linear (KimiLinearForCausalLM: KDA, MLA without RoPE, DeepSeek-V3 MoE) against HF
transformers in float32: each prompt token's log-prob, prefilled in 100-token chunks through the
KV (latent) and state pools, from a checkpoint as Moonshot releases theirs and from llama.cpp's
GGUF of it. A second checkpoint covers the other switches: MLA's q LoRA, a full-attention first
layer, every MLP sparse over two expert groups, and transformers' in-memory tensor names (one
conv1d, forget_gate.*, stacked experts) in the layout save_pretrained gives the rest.
Greedy tokens alone / batched / chunked and prefix reuse: tests/hybrid/test_hybrid_engine.py."""

from __future__ import annotations

import random

import pytest
from safetensors.torch import save_file

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid import kimi_linear_checkpoint as kc
from tests.hybrid import mamba_hybrid_checkpoints as mh
from tests.hybrid.kimi_linear_gguf_writer import dequantized_as_stored, write_kimi_linear_gguf
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.model.top1_agreement import top1_agreement


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """A checkpoint in Moonshot's form (its config.json and tensor names, as released), one expert
    group (as released: llama.cpp's converter does not read Moonshot's num_expert_group, so its
    GGUF must not need one); grouped routing runs in test_hybrid_engine.py's checkpoint."""
    path = str(tmp_path_factory.mktemp("kimi_linear"))
    _, hf = kc.checkpoint(path, tiny_tokenizer(), n_group=1, topk_group=1)
    kc.as_moonshot_checkpoint(path)
    with mh.engine(path) as engine:
        yield engine, hf, path


def test_prompt_logprobs_equal_hf(kimi):
    engine, hf, _ = kimi
    assert engine.flush_cache()
    mh.assert_prompt_logprobs(engine, hf, mh.tokens(random.Random(0), 230), "kimi-linear")


def test_other_switches_and_in_memory_names_equal_hf(tmp_path):
    other = dict(
        q_lora_rank=16,
        layer_types=["full_attention", "linear_attention", "linear_attention"],
        mlp_layer_types=["sparse"] * 3,
        num_hidden_layers=3,
        topk_group=2,
    )
    path, hf = kc.checkpoint(str(tmp_path), tiny_tokenizer(), **other)
    # transformers' own names: the model's state dict as it holds it
    state = {n: t.contiguous() for n, t in hf.state_dict().items()}
    assert "model.layers.1.self_attn.conv1d.weight" in state
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, f"{path}/model.safetensors", metadata={"format": "pt"})
    with mh.engine(path) as engine:
        ids = mh.tokens(random.Random(3), 230)
        mh.assert_prompt_logprobs(engine, hf, ids, "kimi-linear in-memory names")


def test_float_gguf_equals_hf(kimi, tmp_path):
    """llama.cpp's kimi-linear file (float32) of the same checkpoint, written as its converter
    writes it: HF's log-probs, and its greedy tokens."""
    _, hf, src = kimi
    gguf_path = write_kimi_linear_gguf(src, str(tmp_path / "kimi-linear-f32.gguf"))
    with mh.engine(gguf_path) as engine:
        ids = mh.tokens(random.Random(4), 230)
        mh.assert_prompt_logprobs(engine, hf, ids, "kimi-linear GGUF")
        sp = {"max_new_tokens": mh.NEW, "temperature": 0}
        out = engine.generate(input_ids=ids, sampling_params=sp)
        assert_greedy_equal(out["output_ids"], mh.reference(hf)(ids), "kimi-linear GGUF greedy")


def test_q8_0_gguf_agrees_with_hf_top1(tmp_path):
    """llama.cpp's Q8_0 file on the native kernels: top-1 agreement with HF holding the file's
    dequantized weights >= 95% along HF's greedy text (tests/model/top1_agreement.py), as
    tests/hybrid/test_hybrid_gguf.py asks of the other hybrids. The checkpoint has GPT-2's scaled
    residual init, as their mixtures of experts do: with HF's own init this random mixture amplifies
    the activations' int8 rounding (measured 370/398, and llama-server on the same file 369/398
    against the float model) — docs/hybrid.md."""
    path = str(tmp_path / "hf")
    _, hf = kc.checkpoint(path, tiny_tokenizer(), n_group=1, topk_group=1, scaled_residual=True)
    kc.as_moonshot_checkpoint(path)
    q8 = write_kimi_linear_gguf(path, str(tmp_path / "q8_0.gguf"), qtype="q8_0")
    agree, total = top1_agreement(q8, hf, dequantized_as_stored(hf), mh.VOCAB, new_tokens=160)
    assert agree / total >= 0.95, f"kimi-linear Q8_0: top-1 agreement {agree}/{total}"
