"""What the tokenizer manager makes of a request's sampling_params: the model's defaults under the
client's values, the extra samplers' validation, and the token forms of bad_words (vLLM's) and
dry_sequence_breakers (llama.cpp's), against the tokenizer itself. And where the defaults come
from: generation_config.json, and a GGUF's general.sampling.* keys (gguf-py's names)."""

import json

import gguf
import numpy as np
import pytest

from radixlm.engine.request_sampling import RequestSampling
from radixlm.model import sampling_defaults
from radixlm.model.gguf.reader import open_gguf
from radixlm.sampling_params import DRY_SEQUENCE_BREAKERS, SamplingParams, SamplingParamsError
from tests.sampler_refs import vllm_bad_word_forms


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"typical_p": 0}, "typical_p"),
        ({"typical_p": 1.5}, "typical_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": "3"}, "min_tokens"),
        ({"min_tokens": 3, "min_new_tokens": 2}, "min_tokens"),
        ({"min_tokens": 5, "max_new_tokens": 2}, "min_tokens"),
        ({"bad_words": [""]}, "bad_words"),
        ({"bad_words": ["  "]}, "bad_words"),
        ({"bad_words": [3]}, "bad_words"),
        ({"bad_words": {"a": 1}}, "bad_words"),
        ({"bad_words": ["w"] * 129}, "bad_words"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
        ({"allowed_token_ids": [True]}, "allowed_token_ids"),
        ({"dry_multiplier": -0.1}, "dry_multiplier"),
        ({"dry_base": 0.9}, "dry_base"),
        ({"dry_allowed_length": 0}, "dry_allowed_length"),
        ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
        ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": ["x" * 41]}, "dry_sequence_breakers"),
        ({"xtc_probability": 1.1}, "xtc_probability"),
        ({"xtc_threshold": -0.1}, "xtc_threshold"),
        ({"resolved_tokens": {}}, "resolved_tokens"),  # the server's own field: no client sets it
    ],
)
def test_extra_sampler_values_are_refused_naming_the_field(bad, field):
    with pytest.raises(SamplingParamsError, match=field):
        SamplingParams.from_dict(bad).verify(vocab_size=100)


def test_allowed_token_ids_must_be_in_the_vocabulary():
    with pytest.raises(SamplingParamsError, match="allowed_token_ids"):
        SamplingParams.from_dict({"allowed_token_ids": [5, 100]}).verify(vocab_size=100)


def test_min_tokens_is_min_new_tokens():
    assert SamplingParams.from_dict({"min_tokens": 4}).min_new_tokens == 4
    assert SamplingParams.from_dict({"min_tokens": 4, "min_new_tokens": 4}).min_new_tokens == 4


def test_defaults_go_under_the_requests_values(tokenizer):
    rs = RequestSampling(
        tokenizer, len(tokenizer), {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    )
    assert rs.params(None) == SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    assert rs.params({}) == SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    explicit = rs.params({"temperature": 0, "top_k": -1, "max_new_tokens": 5})
    assert explicit == SamplingParams(temperature=0, top_k=-1, top_p=0.95, max_new_tokens=5)
    assert (
        rs.params({"temperature": None}).temperature == 0.6
    )  # null is unset (SGLang's frontend sends it)
    assert RequestSampling(tokenizer, len(tokenizer)).params({}) == SamplingParams()
    with pytest.raises(SamplingParamsError, match="top_p"):
        rs.params({"top_p": 2})


def test_bad_words_forms_are_vllms(tokenizer):
    rs = RequestSampling(tokenizer, len(tokenizer))
    forms = {
        w: vllm_bad_word_forms(tokenizer, w) for w in ["Paris", " hello world", "the", "don't"]
    }
    assert {w: rs.bad_word_ids(w) for w in forms} == forms
    assert any(len(f) == 2 for f in forms.values())  # some words have both forms
    sp = rs.params({"bad_words": ["Paris"]})
    assert sp.resolved_tokens.bad_words == tuple(rs.bad_word_ids("Paris"))
    assert rs.params({"temperature": 0.5}).resolved_tokens is None  # nothing to resolve


def ref_breakers(tokenizer, pieces, breaker, max_tail=20):
    """llama.cpp's get_overlapping_token_sequences, literally."""
    single, multi = set(), {}
    for tid, word in enumerate(pieces):
        if breaker in word:
            single.add(tid)
            continue
        pos = word.find(breaker[0])
        while pos != -1:
            i, match = 1, True
            while i < len(breaker) and i + pos < len(word):
                if word[pos + i] != breaker[i]:
                    match = False
                    break
                i += 1
            if match:
                tail = tuple(tokenizer.encode(breaker[i:], add_special_tokens=False)[:max_tail])
                multi.setdefault(tid, set()).add(tail)
            pos = word.find(breaker[0], pos + 1)
    return single, multi


def test_dry_breaker_forms_are_llama_cpps(tokenizer):
    rs = RequestSampling(tokenizer, len(tokenizer))
    pieces = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    assert rs.pieces() == pieces
    breakers = ("\n", ":", "\n\n###", "</s>", "```python")
    single, multi = rs.breaker_forms(breakers)
    want_single, want_multi = set(), {}
    for b in breakers:
        s, m = ref_breakers(tokenizer, pieces, b)
        want_single |= s
        for h, tails in m.items():
            want_multi.setdefault(h, set()).update(tails)
    assert single == want_single and {h: set(t) for h, t in multi.items()} == want_multi
    assert multi, "multi-token breakers exist for this vocabulary"
    sp = rs.params({"dry_multiplier": 0.8})  # the default breakers
    assert sp.resolved_tokens.dry_single == rs.breaker_forms(DRY_SEQUENCE_BREAKERS)[0]


def test_generation_config_defaults(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "do_sample": True,
                "temperature": 0.6,
                "top_k": 0,
                "top_p": 0.95,
                "min_p": 0.0,
                "repetition_penalty": 1.05,
                "typical_p": 0.5,
                "eos_token_id": [1, 2],
                "max_new_tokens": 99,
            }
        )
    )
    # SGLang's five keys; HF's top_k 0 is "no top-k" (SGLang would refuse every request with it)
    assert sampling_defaults.from_hf_dir(str(tmp_path)) == {
        "temperature": 0.6,
        "top_k": -1,
        "top_p": 0.95,
        "min_p": 0.0,
        "repetition_penalty": 1.05,
    }
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": -1, "top_p": 0.9}))
    assert sampling_defaults.from_hf_dir(str(tmp_path)) == {"top_p": 0.9}  # a bad value is left out
    assert sampling_defaults.from_hf_dir(str(tmp_path / "nowhere")) == {}
    assert sampling_defaults.applied("openai", {"top_p": 0.9}) == {}
    with pytest.raises(ValueError, match="sampling_defaults"):
        sampling_defaults.applied("vllm", {})


def test_gguf_sampling_metadata_keys(tmp_path):
    """llama.cpp's keys, as gguf-py names them, written by gguf-py's own writer."""
    assert set(sampling_defaults.GGUF_KEYS) == {
        gguf.Keys.General.SAMPLING_TEMP,
        gguf.Keys.General.SAMPLING_TOP_K,
        gguf.Keys.General.SAMPLING_TOP_P,
        gguf.Keys.General.SAMPLING_MIN_P,
        gguf.Keys.General.SAMPLING_PENALTY_REPEAT,
        gguf.Keys.General.SAMPLING_XTC_PROBABILITY,
        gguf.Keys.General.SAMPLING_XTC_THRESHOLD,
    }
    path = str(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_sampling_temp(0.7)
    w.add_sampling_top_k(40)
    w.add_sampling_top_p(0.95)
    w.add_sampling_min_p(0.05)
    w.add_sampling_penalty_repeat(1.1)
    w.add_sampling_xtc_probability(0.5)
    w.add_sampling_xtc_threshold(0.1)
    w.add_sampling_mirostat(2)  # no such sampler here: not taken
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert sampling_defaults.from_gguf(open_gguf(path)) == {
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "xtc_probability": 0.5,
        "xtc_threshold": 0.1,
    }
