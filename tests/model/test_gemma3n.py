"""Gemma 3n's text model from a checkpoint in the released layout (Gemma3nForConditionalGeneration,
tests/model/gemma3n_checkpoint.py) against HF's Gemma3nForCausalLM in float32: AltUp, Laurel,
activation sparsity, KV shared by the last layers, per-layer inputs, sliding windows shorter than
every prompt, soft-capped logits. HF's greedy tokens and their log-probabilities alone, batched, in
prefill chunks smaller than the prompt, and on a second turn served from the radix cache; the
towers' tensors skipped; bad config fields refused by name; image and audio parts 400s."""

from __future__ import annotations

import json
import os

import pytest
import torch

from radixlm import Engine
from radixlm.model.loader import load_model
from tests.model.cache_checks import ids
from tests.model.gemma3n_checkpoint import gemma3n_checkpoint
from tests.model.windowed_checkpoints import CHUNK, NEW, WINDOW, _references, reference

SP = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
LOGPROB_ATOL = 1e-4  # float32 on both sides (test_deepseek.py's)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A head of its own and a per-layer table of the whole vocabulary (the GGUF tests': the
    converter pads a smaller one with zeros, which llama.cpp and radixlm read where HF reads its
    row 0; the released layout's smaller table is test_tied_head_as_released's)."""
    path = str(tmp_path_factory.mktemp("gemma3n"))
    return path, gemma3n_checkpoint(path, full_ple_table=True, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def engine(ckpt):
    path, _ = ckpt
    with Engine(
        model_path=path,
        quantization="none",
        enable_invariant_checks=True,
        chunked_prefill_size=CHUNK,
        log_level="warning",
    ) as e:
        yield e


def assert_hf(out: dict, ref: tuple, label: str) -> None:
    """HF's greedy tokens, and their log-probabilities to LOGPROB_ATOL."""
    ids, gen, logits = ref
    assert out["output_ids"] == gen, f"{label}: {out['output_ids']} vs HF {gen}"
    got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    want = torch.log_softmax(logits.float(), -1)[torch.arange(len(gen)), torch.tensor(gen)]
    assert (got - want).abs().max().item() < LOGPROB_ATOL, label


def test_layers_kv_sharing_and_skipped_towers(ckpt):
    path, hf = ckpt
    assert hf.config.kv_sharing_modes == [None, "store", "store", "reuse", "reuse"]
    loaded = load_model(path, quantization="none")
    assert loaded.architecture == "Gemma3nForConditionalGeneration"
    attns = [layer.self_attn.attn for layer in loaded.model.model.layers]
    assert [a.layer_id for a in attns] == [0, 1, 2, 2, 1]
    assert [a.sliding_window_size for a in attns] == [WINDOW, None, WINDOW, WINDOW, None]
    assert loaded.model.kv_shared_layers == [3, 4]
    names = {n for n, _ in loaded.model.named_parameters()}
    assert not any("tower" in n or "embed_vision" in n or "embed_audio" in n for n in names)


def test_alone_batched_and_chunked_match_hf(engine, ckpt):
    """Prompts of 5 to 45 tokens (all but the first longer than the window and the chunk): alone,
    then batched, HF's tokens and log-probabilities."""
    _, hf = ckpt
    prompts, refs = _references(hf)
    for i, p in enumerate(prompts):
        assert engine.flush_cache()
        out = engine.generate(input_ids=p, sampling_params=SP, return_logprob=True)
        assert out["meta_info"]["cached_tokens"] == 0
        assert_hf(out, refs[i], f"alone #{i}")
    assert engine.flush_cache()
    outs = engine.generate(input_ids=prompts, sampling_params=SP, return_logprob=True)
    for i, out in enumerate(outs):
        assert_hf(out, refs[i], f"batched #{i}")


def test_second_turn_from_the_radix_cache(engine, ckpt):
    _, hf = ckpt
    prompts, refs = _references(hf)
    assert engine.flush_cache()
    first = engine.generate(input_ids=prompts[1], sampling_params=SP)
    second = prompts[1] + first["output_ids"] + prompts[0]
    out = engine.generate(input_ids=second, sampling_params=SP, return_logprob=True)
    assert out["meta_info"]["cached_tokens"] >= len(prompts[1])
    assert_hf(out, reference(hf, second), "second turn")


def test_tied_head_as_released(tmp_path):
    """The releases' tied head (no lm_head tensor in the file) and a per-layer table smaller than
    the vocabulary (the prompt's ids past it read row 0): HF's tokens and log-probs."""
    hf = gemma3n_checkpoint(str(tmp_path))
    assert hf.config.tie_word_embeddings
    prompt = ids(8, 45)
    assert max(prompt) >= hf.config.vocab_size_per_layer_input
    with Engine(model_path=str(tmp_path), quantization="none", log_level="warning") as e:
        out = e.generate(input_ids=prompt, sampling_params=SP, return_logprob=True)
    assert_hf(out, reference(hf, prompt), "tied")


def _with_text_config(path: str, tmp_path, **changes) -> str:
    out = tmp_path / "changed"
    out.mkdir()
    for f in os.listdir(path):
        if f != "config.json":
            (out / f).symlink_to(os.path.join(path, f))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["text_config"].update(changes)
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f)
    return str(out)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"altup_active_idx": 1}, "altup_active_idx"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"activation_sparsity_pattern": [1.0, 0.0, 0.0, 0.0, 0.0]}, "activation_sparsity_pattern"),
        ({"hidden_size_per_layer_input": 0}, "hidden_size_per_layer_input"),
        ({"altup_num_inputs": 0}, "altup_num_inputs"),
        ({"num_kv_shared_layers": 4}, "num_kv_shared_layers"),
    ],
)
def test_bad_config_fields_are_refused_by_name(ckpt, tmp_path, changes, field):
    path, _ = ckpt
    with pytest.raises(ValueError, match=field):
        load_model(_with_text_config(path, tmp_path, **changes), quantization="none")


@pytest.fixture(scope="module")
def server(ckpt):
    from radixlm.server.process import ServerProcess
    from tests.conftest import TINY_SERVE

    path, _ = ckpt
    s = ServerProcess("--model-path", path, *TINY_SERVE)
    yield s
    s.stop()


@pytest.mark.parametrize(
    "part, named",
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image_url"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "input_audio"),
    ],
)
def test_image_or_audio_parts_are_400s_and_the_server_goes_on(server, part, named):
    """The towers are not run: a chat request with an image or audio part is a 400 naming it, and
    the next text request is answered."""
    import requests

    content = [{"type": "text", "text": "what is this?"}, part]
    r = requests.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": content}], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 400 and named in r.text, r.text
    r = requests.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text


def test_a_backend_reading_one_kv_shape_is_refused(ckpt):
    """The KV-sharing layers keep nothing in the pool: Gemma 4's start-up refusal, in one line."""
    path, _ = ckpt
    with pytest.raises(Exception, match="keeps KV of different shapes per layer"):
        Engine(model_path=path, quantization="none", log_level="warning", attention_backend="torch")


def test_gguf_greedy_matches_hf(ckpt, tmp_path):
    """The text model as llama.cpp's converter writes it: HF's tokens alone, batched and in
    prefill chunks; the converter's std multipliers taken as they are."""
    from tests.model.gemma3n_checkpoint import write_gemma3n_gguf
    from tests.model.windowed_checkpoints import check_greedy

    path, hf = ckpt
    gguf_path = write_gemma3n_gguf(hf, path, str(tmp_path / "gemma3n.gguf"))
    loaded = load_model(gguf_path, quantization="none")
    assert loaded.architecture == "Gemma3nForCausalLM"
    mults = [layer.mlp.std_multiplier for layer in loaded.model.model.layers]
    assert mults[1] is None and mults[4] is None and mults[0] == pytest.approx(1.6448536)
    check_greedy(gguf_path, hf, "gemma3n gguf")


def test_q8_0_gguf_agrees_with_hf_top1(ckpt, tmp_path):
    """A Q8_0 file (its matrices kept quantized, the native kernels): top-1 agreement >= 95% with
    HF holding the file's dequantized weights, along HF's own greedy text."""
    from tests.hybrid.test_hybrid_gguf import hf_holding
    from tests.model.gemma3n_checkpoint import write_gemma3n_gguf
    from tests.model.top1_agreement import top1_agreement
    from tests.model.windowed_checkpoints import VOCAB

    path, hf = ckpt
    q8 = write_gemma3n_gguf(hf, path, str(tmp_path / "gemma3n-q8_0.gguf"), "q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), VOCAB, new_tokens=120)
    assert agree / total >= 0.95, f"gemma3n Q8_0: top-1 agreement {agree}/{total}"
