"""Thinking budgets and grammars after the thinking (constrained/thinking.py), on the tiny random
Llama with SmolLM2's tokenizer, where "</think>" is several tokens: through the Engine and HTTP."""

import json
import random

import jsonschema
import openai
import pytest
import requests
import torch

from radixlm import Engine
from radixlm.model.loader import load_tokenizer
from tests.conftest import engine_args

GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with Engine(tiny_model_dir, **engine_args(reasoning_parser="qwen3")) as e:
        yield e


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def end_ids(tok):
    ids = tok.encode("</think>", add_special_tokens=False)
    assert len(ids) > 1  # the served tokenizer spells the marker in several tokens
    return ids


def prompt(seed, n=12):
    rng = random.Random(seed)
    return [rng.randrange(3, 40000) for _ in range(n)]


def hf_greedy(hf, ids, n):
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_budget_forces_the_end_marker_after_exactly_n_tokens(
    engine, tiny_hf_model, end_ids, budget
):
    p = prompt(budget)
    free = engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"]
    assert (
        free[budget : budget + len(end_ids)] != end_ids
    )  # the model would not close the block there
    out = engine.generate(input_ids=p, sampling_params={**GREEDY, "max_thinking_tokens": budget})[
        "output_ids"
    ]
    k = budget + len(end_ids)
    assert out[:budget] == free[:budget]  # the thinking itself is the model's
    assert out[budget:k] == end_ids
    # and the answer goes on from the closed block as the model (HF) continues it
    assert out[k:] == hf_greedy(tiny_hf_model, p + out[:k], len(out) - k)


def test_budget_spellings_agree(engine):
    p = prompt(7)
    outs = [
        engine.generate(input_ids=p, sampling_params={**GREEDY, **extra})["output_ids"]
        for extra in (
            {"max_thinking_tokens": 3},
            {"thinking_budget": 3},
            {"thinking_token_budget": 3},
            {"custom_params": {"thinking_budget": 3}},
        )
    ]
    assert outs[1:] == outs[:1] * 3
    with pytest.raises(ValueError, match="max_thinking_tokens, thinking_budget differ"):
        engine.generate(
            input_ids=p, sampling_params={**GREEDY, "max_thinking_tokens": 3, "thinking_budget": 4}
        )


def test_mixed_batch_gives_each_request_what_it_gets_alone(engine):
    prompts = [prompt(10 + i, 6 + 3 * i) for i in range(5)]
    sps = [
        {**GREEDY, "max_thinking_tokens": 2},
        GREEDY,
        {**GREEDY, "max_thinking_tokens": 0},
        {**GREEDY, "require_reasoning": True},
        {**GREEDY, "max_thinking_tokens": 7},
    ]
    alone = [
        engine.generate(input_ids=p, sampling_params=sp)["output_ids"]
        for p, sp in zip(prompts, sps)
    ]
    batched = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sps)]
    assert batched == alone
    # a thinking request without a budget is never cut: it gets what a plain one gets
    assert alone[3] == engine.generate(input_ids=prompts[3], sampling_params=GREEDY)["output_ids"]


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


def test_json_schema_applies_after_the_thinking(engine, tok, end_ids):
    word = tok.encode(" hello", add_special_tokens=False)[0]  # no JSON text starts with it
    sp = {
        "max_new_tokens": 60,
        "temperature": 0,
        "json_schema": json.dumps(SCHEMA),
        "require_reasoning": True,
        "max_thinking_tokens": 4,
        "logit_bias": {str(word): 100},
    }
    out = engine.generate(input_ids=prompt(3), sampling_params=sp)
    ids = out["output_ids"]
    assert ids[:4] == [word] * 4  # unconstrained thinking: the bias wins there
    assert ids[4 : 4 + len(end_ids)] == end_ids
    answer = tok.decode(ids[4 + len(end_ids) :], skip_special_tokens=True)
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    # without require_reasoning the grammar starts at once: the biased word cannot come first
    plain = engine.generate(
        input_ids=prompt(3),
        sampling_params={
            k: v for k, v in sp.items() if k not in ("require_reasoning", "max_thinking_tokens")
        },
    )
    jsonschema.validate(json.loads(plain["text"]), SCHEMA)


def test_thinking_needs_a_reasoning_parser(tiny_model_dir):
    with Engine(tiny_model_dir, **engine_args()) as e:
        with pytest.raises(
            ValueError, match="max_thinking_tokens needs a server started with --reasoning-parser"
        ):
            e.generate(input_ids=prompt(1), sampling_params={**GREEDY, "max_thinking_tokens": 2})


# ------------------------------------------------------------------ HTTP
@pytest.fixture(scope="module")
def server(reasoning_server):
    """The tiny model with --reasoning-parser qwen3, shared with test_anthropic_api (conftest)."""
    return reasoning_server


def test_http_generate_budget_streamed_and_not(server, end_ids):
    body = {"input_ids": prompt(5), "sampling_params": {**GREEDY, "max_thinking_tokens": 6}}
    whole = requests.post(server.url + "/generate", json=body, timeout=120).json()
    assert whole["output_ids"][6 : 6 + len(end_ids)] == end_ids
    with requests.post(
        server.url + "/generate", json={**body, "stream": True}, stream=True, timeout=120
    ) as r:
        events = [
            line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")
        ]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["text"] == whole["text"] and "</think>" in whole["text"]
    bad = requests.post(
        server.url + "/generate",
        json={"input_ids": prompt(5), "sampling_params": {"max_thinking_tokens": -1}},
        timeout=60,
    )
    assert bad.status_code == 400 and "max_thinking_tokens" in bad.json()["error"]["message"]


def test_chat_budget_and_response_format_after_thinking(server, tok, end_ids):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Is the sky blue?"}]
    r = client.chat.completions.create(
        model="m",
        messages=msgs,
        max_tokens=20,
        temperature=0,
        extra_body={"max_thinking_tokens": 5, "return_token_ids": True, "ignore_eos": True},
    )
    assert r.choices[0].model_extra["token_ids"][5 : 5 + len(end_ids)] == end_ids
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    word = tok.encode(" hello", add_special_tokens=False)[0]
    r = client.chat.completions.create(
        model="m",
        messages=msgs,
        max_tokens=60,
        temperature=0,
        response_format=rf,
        logit_bias={str(word): 100},
        extra_body={"thinking_budget": 3},
    )
    text = r.choices[0].message.content
    if (
        r.choices[0].message.model_extra.get("reasoning_content") is None
    ):  # no reasoning split on this route
        think, _, text = text.partition("</think>")
        assert think == tok.decode([word] * 3)
    jsonschema.validate(json.loads(text), SCHEMA)
    # enable_thinking false: no think block, so the grammar starts at once and no budget applies
    r = client.chat.completions.create(
        model="m",
        messages=msgs,
        max_tokens=60,
        temperature=0,
        response_format=rf,
        extra_body={"thinking_budget": 3, "chat_template_kwargs": {"enable_thinking": False}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    with pytest.raises(openai.BadRequestError, match="thinking_budget"):
        client.chat.completions.create(
            model="m", messages=msgs, max_tokens=5, extra_body={"thinking_budget": -2}
        )
