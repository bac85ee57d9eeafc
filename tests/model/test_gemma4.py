"""Gemma 4's text model (issue 64) from HF safetensors against transformers in float32: sliding
layers of one head shape (window 8, so every prompt and answer crosses it) beside global layers of
a wider head and fewer KV heads with V = K's projection and proportional RoPE, the last layers
reading earlier layers' KV, per-layer inputs, learned layer scalars, soft-capped logits, and (the
second model) routed GELU experts beside the dense MLP; greedy tokens (near-tie rule) alone,
batched and in prefill chunks, through the pool's two slot spaces of per-layer shapes."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.model.loader import load_model
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.gemma4_checkpoint import DENSE, MOE, gemma4_checkpoint, write_gemma4_gguf
from tests.model.windowed_checkpoints import NEW, VOCAB, WINDOW, _references, check_greedy


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gemma4"))
    return path, gemma4_checkpoint(path, **DENSE)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gemma4moe"))
    return path, gemma4_checkpoint(path, **MOE)


def test_layers_and_kv_shapes(dense):
    """The pool keeps each layer's own shape and nothing for the layers that read another's KV."""
    path, hf = dense
    assert hf.config.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    loaded = load_model(path)
    attns = [layer.self_attn.attn for layer in loaded.model.model.layers]
    assert [a.layer_id for a in attns] == [0, 1, 2, 3, 2, 3]
    assert [a.head_dim for a in attns] == [16, 32] * 3
    assert [a.sliding_window_size for a in attns] == [WINDOW, None] * 3
    from radixlm.model.memory.kv_layout import kv_layout

    layout = kv_layout(loaded.model, loaded.hf_config)
    assert layout.layer_shapes == ((2, 16), (1, 32), (2, 16), (1, 32), (0, 32), (0, 32))


def test_safetensors_greedy_matches_hf(dense):
    path, hf = dense
    check_greedy(path, hf, "gemma4")


def test_moe_greedy_matches_hf(moe):
    path, hf = moe
    check_greedy(path, hf, "gemma4-moe")


def test_one_slot_space_also_matches_hf(dense):
    """--disable-hybrid-swa-memory: every layer in one pool, still of per-layer shapes."""
    path, hf = dense
    prompts, refs = _references(hf)
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(
        model_path=path,
        quantization="none",
        disable_hybrid_swa_memory=True,
        enable_invariant_checks=True,
        log_level="warning",
    ) as engine:
        for i, out in enumerate(engine.generate(input_ids=prompts, sampling_params=sp)):
            assert_greedy_equal(out["output_ids"], refs[i], f"gemma4 one space #{i}")


@pytest.mark.parametrize(
    "options, why",
    [
        ({"attention_backend": "torch"}, "attention backend reads one KV shape"),
        ({"speculative_algorithm": "NGRAM"}, "speculative decoding"),
    ],
)
def test_what_cannot_hold_per_layer_shapes_is_refused(dense, options, why):
    path, _ = dense
    with pytest.raises(Exception, match=f"keeps KV of different shapes per layer.*{why}"):
        Engine(model_path=path, quantization="none", log_level="warning", **options)


@pytest.mark.parametrize("layout", ["dense", "moe"])
def test_gguf_greedy_matches_hf(layout, request, tmp_path):
    """The same weights as llama.cpp's converter writes them: HF's tokens."""
    path, hf = request.getfixturevalue(layout)
    gguf_path = write_gemma4_gguf(hf, path, str(tmp_path / f"gemma4-{layout}.gguf"))
    check_greedy(gguf_path, hf, f"gemma4 {layout} gguf")


@pytest.mark.parametrize("layout", ["dense", "moe"])
def test_q8_0_gguf_agrees_with_hf_top1(layout, request, tmp_path):
    """A Q8_0 file (its weights kept quantized, the native kernels): top-1 agreement >= 95% with
    HF holding the file's dequantized weights, along HF's own greedy text."""
    from tests.hybrid.test_hybrid_gguf import hf_holding
    from tests.model.top1_agreement import top1_agreement

    path, hf = request.getfixturevalue(layout)
    q8 = write_gemma4_gguf(hf, path, str(tmp_path / f"gemma4-{layout}-q8_0.gguf"), "q8_0")
    hf_q8 = hf_holding(hf, q8)
    agree, total = top1_agreement(q8, hf, hf_q8, VOCAB, new_tokens=120)
    assert agree / total >= 0.95, f"gemma4 {layout} Q8_0: top-1 agreement {agree}/{total}"
