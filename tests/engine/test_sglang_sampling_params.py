"""SGLang 0.5's sampling parameters beyond the classic ones, on a tiny random Llama: logit_bias
(against HF's sequence_bias), stop_regex (against re.search over the plain output, trimmed,
streamed without ever showing text it later trims), stream_interval, structural_tag (output
matched against its pattern), sampling_seed, and null meaning the default."""

import json
import random
import re

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with Engine(tiny_model_dir, **engine_args(chunked_prefill_size=64)) as e:
        yield e


def prompt(seed, n=10):
    rng = random.Random(seed)
    return [rng.randrange(3, 40000) for _ in range(n)]


GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


def test_logit_bias_matches_hf_sequence_bias_and_leaves_other_rows_alone(engine, tiny_hf_model):
    ids, other = prompt(1), prompt(2)
    plain = engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    # Ban the greedy first choice and push a mid-ranked token up: the path changes.
    bias = {str(plain[0]): -100.0, "1234": 3.5, str(plain[2]): 2.0}
    ref = tiny_hf_model.generate(
        torch.tensor([ids]),
        max_new_tokens=16,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        sequence_bias={(int(t),): b for t, b in bias.items()},
    )
    ref = ref[0, len(ids) :].tolist()
    assert ref != plain and plain[0] not in ref
    outs = engine.generate(
        input_ids=[ids, other], sampling_params=[{**GREEDY, "logit_bias": bias}, GREEDY]
    )
    assert outs[0]["output_ids"] == ref
    assert (
        outs[1]["output_ids"]
        == engine.generate(input_ids=other, sampling_params=GREEDY)["output_ids"]
    )
    # Sampling follows the bias too: +100 on one token makes it certain.
    s = engine.generate(
        input_ids=ids,
        sampling_params={
            "max_new_tokens": 6,
            "temperature": 1.0,
            "ignore_eos": True,
            "logit_bias": {"777": 100},
        },
    )
    assert s["output_ids"] == [777] * 6


def _expected_stop(text, pattern):
    m = re.search(pattern, text)
    assert m is not None, (pattern, text)
    return m


@pytest.mark.parametrize("bounded", [True, False])
def test_stop_regex_stops_trims_and_streams_only_what_stays(engine, bounded):
    ids = prompt(3)
    sp = {**GREEDY, "max_new_tokens": 24}
    base = engine.generate(input_ids=ids, sampling_params=sp)
    text = base["text"]
    i = len(text) // 2
    a, b = re.escape(text[i]), re.escape(text[i + 2])
    pattern = f"{a}(?s:.){b}" if bounded else f"{a}(?s:.*?){b}"
    m = _expected_stop(text, pattern)
    out = engine.generate(
        input_ids=ids, sampling_params={**sp, "stop_regex": [r"\A\b\Z never", pattern]}
    )
    assert out["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": pattern,
        "matched_regex": True,
    }
    assert out["text"] == text[: m.start()]
    assert out["output_ids"] == base["output_ids"][: len(out["output_ids"])]
    kept = engine.generate(
        input_ids=ids, sampling_params={**sp, "stop_regex": pattern, "no_stop_trim": True}
    )
    assert kept["text"].startswith(text[: m.end()])
    chunks = list(
        engine.generate(input_ids=ids, sampling_params={**sp, "stop_regex": pattern}, stream=True)
    )
    assert chunks[-1]["text"] == out["text"]
    assert all(
        out["text"].startswith(c["text"]) for c in chunks
    )  # nothing shown that is later trimmed


def test_stream_interval_sends_a_chunk_every_n_tokens(engine):
    ids = prompt(4)
    every = list(engine.generate(input_ids=ids, sampling_params=GREEDY, stream=True))
    four = list(
        engine.generate(
            input_ids=ids, sampling_params={**GREEDY, "stream_interval": 4}, stream=True
        )
    )
    # SGLang's scheduler streams when len(output_ids) % 4 == 1: the first token at once, then
    # every 4, and the finished request's last chunk
    assert [len(c["output_ids"]) for c in four] == [1, 5, 9, 13, 16]
    assert len(every) == 16 and four[-1]["output_ids"] == every[-1]["output_ids"]


def test_structural_tag_output_follows_the_tag(engine):
    # A random model loops on whitespace inside JSON; the JSON-schema form is tested on the
    # default model (tests/e2e/test_sglang_frontend.py). Here: xgrammar's format with a regex body.
    body = r"[a-z]{3,6}=[0-9]{1,3}"
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<call>",
            "end": "</call>",
            "content": {"type": "regex", "pattern": body},
        },
    }
    for st in (tag, json.dumps(tag)):  # an object or its JSON text
        out = engine.generate(
            input_ids=prompt(5),
            sampling_params={"max_new_tokens": 40, "temperature": 0, "structural_tag": st},
        )
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert re.fullmatch(f"<call>{body}</call>", out["text"]), out["text"]


def test_structural_tag_errors_name_the_field(engine):
    for bad in (
        {"structures": [{"begin": "<a>"}], "triggers": ["<a"]},
        "not json",
        {"type": "structural_tag"},
    ):
        with pytest.raises(ValueError, match="sampling_params.structural_tag"):
            engine.generate(
                input_ids=prompt(6), sampling_params={"max_new_tokens": 4, "structural_tag": bad}
            )
    assert (
        engine.generate(input_ids=prompt(6), sampling_params=GREEDY)["meta_info"][
            "completion_tokens"
        ]
        == 16
    )


def test_sampling_seed_and_nulls(engine):
    ids = prompt(7)
    sp = {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    a = engine.generate(input_ids=ids, sampling_params={**sp, "sampling_seed": 11})["output_ids"]
    assert a == engine.generate(input_ids=ids, sampling_params={**sp, "seed": 11})["output_ids"]
    assert (
        a
        == engine.generate(input_ids=ids, sampling_params={**sp, "sampling_seed": 11})["output_ids"]
    )
    # SGLang's frontend sends every key, unset ones as null: null means the default.
    nulls = {
        "top_p": None,
        "top_k": None,
        "min_p": None,
        "stop": None,
        "stop_regex": None,
        "regex": None,
        "json_schema": None,
        "frequency_penalty": None,
        "presence_penalty": None,
        "n": None,
    }
    out = engine.generate(input_ids=ids, sampling_params={**GREEDY, **nulls})
    assert out["output_ids"] == engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    with pytest.raises(ValueError, match="sampling_seed"):
        engine.generate(input_ids=ids, sampling_params={**sp, "seed": 1, "sampling_seed": 2})
    with pytest.raises(ValueError, match="logit_bias"):
        engine.generate(input_ids=ids, sampling_params={**sp, "logit_bias": {"99999999": 1.0}})
