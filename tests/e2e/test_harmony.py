"""gpt-oss's harmony chat format end to end, through the official `openai` client, on a tiny random
gpt-oss (tests/e2e/harmony_template.py) served without --reasoning-parser or --tool-call-parser:
both are detected from the template. tool_choice "required" and named give calls whose arguments
fit the schema, written as harmony commentary messages; a forced analysis + final output comes back
split into reasoning_content and content; reasoning_effort reaches the template; a tool result
renders."""

import json
import re

import jsonschema
import openai
import pytest
import requests

from radixlm.model.loader import load_tokenizer
from radixlm.server.process import ServerProcess
from tests.conftest import TINY_SERVE
from tests.e2e.harmony_template import CONTROL_TOKENS, harmony_checkpoint

WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location", "unit"],
    "additionalProperties": False,
}
STOCK = {
    "type": "object",
    "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}},
    "required": ["ticker"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
    for n, d, p in (("get_weather", "Weather.", WEATHER), ("get_stock", "A quote.", STOCK))
]
SCHEMAS = {"get_weather": WEATHER, "get_stock": STOCK}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def harmony(tmp_path_factory, default_model_path):
    path = harmony_checkpoint(str(tmp_path_factory.mktemp("harmony")), default_model_path)
    server = ServerProcess("--model-path", path, *TINY_SERVE)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    yield server, client, client.models.list().data[0].id, load_tokenizer(path)
    server.stop()


def _clean(text: str | None) -> None:
    assert not any(t in (text or "") for t in CONTROL_TOKENS), text


def _streamed(stream) -> tuple[str, str, dict, str]:
    """(content, reasoning_content, {index: [name, arguments]}, finish_reason) of a stream."""
    content, reasoning, calls, finish = [], [], {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        d = ch.delta
        content.append(d.content or "")
        reasoning.append((d.model_extra or {}).get("reasoning_content") or "")
        for tc in d.tool_calls or []:
            call = calls.setdefault(tc.index, ["", ""])
            call[0] += (tc.function.name or "") if tc.function else ""
            call[1] += (tc.function.arguments or "") if tc.function else ""
        finish = ch.finish_reason or finish
    return "".join(content), "".join(reasoning), calls, finish


def test_both_parsers_are_detected_from_the_template(harmony):
    server, *_ = harmony
    info = requests.get(server.url + "/get_model_info", timeout=30).json()
    assert info["architectures"] == ["GptOssForCausalLM"], info
    assert requests.get(server.url + "/server_info", timeout=30).json()["reasoning_parser"] == (
        "gpt-oss"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "get_stock"])
def test_forced_calls_are_harmony_messages_that_fit_the_schema(harmony, choice, stream):
    _, client, model, tok = harmony
    tool_choice = (
        choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    )
    kw = dict(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice=tool_choice,
        max_tokens=96,
        temperature=0,
    )
    if stream:
        content, reasoning, calls, finish = _streamed(
            client.chat.completions.create(stream=True, **kw)
        )
        calls = [tuple(calls[i]) for i in sorted(calls)]
    else:
        r = client.chat.completions.create(extra_body={"return_token_ids": True}, **kw)
        msg, finish = r.choices[0].message, r.choices[0].finish_reason
        content, reasoning = msg.content, (msg.model_extra or {}).get("reasoning_content")
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        # the model's own tokens: a harmony call (the grammar spells it), ended by a stop token
        text = tok.decode(r.choices[0].model_extra["token_ids"], skip_special_tokens=False)
        name = calls[0][0]
        assert text.startswith(
            f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{{"
        ), text
    assert finish == "tool_calls"
    assert not content and not reasoning
    assert len(calls) == 1
    name, arguments = calls[0]
    assert name in SCHEMAS if choice == "required" else name == choice
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_analysis_and_final_channels_split(harmony, stream):
    """The output forced (a regex) to an analysis message then a final one: the channels come back
    as reasoning_content and content, no control token in either."""
    _, client, model, _ = harmony
    out = (
        "<|channel|>analysis<|message|>The user asks about Paris.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is sunny."
    )
    kw = dict(
        model=model,
        messages=ASK,
        max_tokens=80,
        temperature=0,
        extra_body={"regex": re.escape(out)},
    )
    if stream:
        content, reasoning, calls, _ = _streamed(client.chat.completions.create(stream=True, **kw))
        assert not calls
    else:
        msg = client.chat.completions.create(**kw).choices[0].message
        content, reasoning = msg.content, msg.model_extra["reasoning_content"]
        assert not msg.tool_calls
    assert (reasoning, content) == ("The user asks about Paris.", "It is sunny.")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_free_output_leaks_no_control_token(harmony, stream):
    _, client, model, _ = harmony
    kw = dict(model=model, messages=ASK, tools=TOOLS, max_tokens=48, temperature=1.0, seed=3)
    if stream:
        content, reasoning, calls, _ = _streamed(client.chat.completions.create(stream=True, **kw))
    else:
        msg = client.chat.completions.create(**kw).choices[0].message
        content, reasoning = msg.content, (msg.model_extra or {}).get("reasoning_content")
    _clean(content)
    _clean(reasoning)


def test_reasoning_effort_reaches_the_template(harmony):
    server, client, model, tok = harmony

    def prompt(**kw):
        r = client.chat.completions.create(
            model=model, messages=ASK, max_tokens=1, extra_body={"return_token_ids": True}, **kw
        )
        return tok.decode(r.model_extra["prompt_token_ids"], skip_special_tokens=False)

    assert "Reasoning: medium" in prompt()  # the template's default
    assert "Reasoning: high" in prompt(reasoning_effort="high")
    assert "Reasoning: low" in prompt(reasoning_effort="low")
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        prompt(reasoning_effort="extreme")
    # the Responses API's reasoning.effort: the same template variable
    r = client.responses.create(
        model=model, input="Hi", reasoning={"effort": "high"}, max_output_tokens=4
    )
    assert r.status in ("completed", "incomplete")
    bad = requests.post(
        server.url + "/v1/responses",
        json={"model": model, "input": "Hi", "reasoning": {"effort": "extreme"}},
        timeout=60,
    )
    assert bad.status_code == 400 and "effort" in bad.text


def test_a_tool_result_turn_renders_and_answers(harmony):
    _, client, model, tok = harmony
    messages = [
        {"role": "system", "content": "Answer briefly."},
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"location": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        max_tokens=16,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    prompt = tok.decode(r.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"location"' in prompt
    )
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temperature"'
        in prompt
    )
    assert "type get_weather = (_: {" in prompt and prompt.endswith("<|start|>assistant")
    _clean(r.choices[0].message.content)
