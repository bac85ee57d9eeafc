"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the official
`anthropic` client, against the OpenAI chat route of the same server (greedy answers, prompt
token counts) and the tokenizer's own chat template. The server has an API key, which the
anthropic client sends as x-api-key and the openai client as Authorization: Bearer."""

import anthropic
import jsonschema
import openai
import pytest
import requests

from radixlm.server.process import ServerProcess

KEY = "anthropic-test-key-0123456789"
SYSTEM = "You are a helpful assistant. Answer briefly."
USER = "What is the capital of France?"
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "required": ["city", "unit"],
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
    },
}
# Newer anthropic clients dropped the sampling keyword arguments; the API (and the route) still
# takes them.
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--enable-invariant-checks", env={"RADIXLM_API_KEY": KEY})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id


def chat_messages():
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def test_plain_answer_equals_chat_route(claude, oai, model):
    ref = oai.chat.completions.create(
        model=model, messages=chat_messages(), max_tokens=16, temperature=0
    )
    msg = claude.messages.create(
        model=model,
        max_tokens=16,
        system=SYSTEM,
        **GREEDY,
        messages=[{"role": "user", "content": USER}],
    )
    assert (
        msg.id.startswith("msg_")
        and msg.type == "message"
        and msg.role == "assistant"
        and msg.model == model
    )
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == ref.choices[
        0
    ].message.content
    assert (
        msg.stop_reason
        == {"length": "max_tokens", "stop": "end_turn"}[ref.choices[0].finish_reason]
    )
    assert msg.stop_sequence is None
    # Anthropic's usage: input_tokens + cache_read_input_tokens is the whole prompt.
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    assert msg.usage.cache_read_input_tokens > 0  # the same prompt ran just before
    assert msg.usage.output_tokens == ref.usage.completion_tokens
    # The system prompt as text blocks and the user turn as blocks render the same prompt.
    blocks = claude.messages.create(
        model=model,
        max_tokens=16,
        **GREEDY,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": USER}]}],
    )
    assert blocks.content[0].text == msg.content[0].text


def test_stop_sequence(claude, oai, model):
    text = (
        oai.chat.completions.create(
            model=model, messages=chat_messages(), max_tokens=16, temperature=0
        )
        .choices[0]
        .message.content
    )
    word = text.split()[1]  # a word inside the greedy answer
    ref = oai.chat.completions.create(
        model=model, messages=chat_messages(), max_tokens=16, temperature=0, stop=[word]
    )
    msg = claude.messages.create(
        model=model,
        max_tokens=16,
        system=SYSTEM,
        **GREEDY,
        stop_sequences=[word],
        messages=[{"role": "user", "content": USER}],
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == word
    assert msg.content[0].text == ref.choices[0].message.content


def test_stream_events_and_text(claude, model):
    kw = dict(
        model=model,
        max_tokens=20,
        system=SYSTEM,
        **GREEDY,
        messages=[{"role": "user", "content": USER}],
    )
    full = claude.messages.create(**kw)
    events = list(claude.messages.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert all(e.index == 0 for e in events[1:-2]) and events[1].content_block.type == "text"
    assert "".join(e.delta.text for e in events[2:-3]) == full.content[0].text
    assert events[-2].delta.stop_reason == full.stop_reason
    assert events[-2].usage.output_tokens == full.usage.output_tokens
    with claude.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full.content[0].text and final.content[0].text == text
    assert final.stop_reason == full.stop_reason
    assert (
        final.usage.input_tokens + final.usage.cache_read_input_tokens
        == full.usage.input_tokens + full.usage.cache_read_input_tokens
    )


def test_count_tokens_equals_chat_prompt_tokens(claude, oai, model, server):
    ref = oai.chat.completions.create(model=model, messages=chat_messages(), max_tokens=1)
    got = claude.messages.count_tokens(
        model=model, system=SYSTEM, messages=[{"role": "user", "content": USER}]
    )
    assert got.input_tokens == ref.usage.prompt_tokens
    # A history with a tool call and its result: the template's own rendering of OpenAI's form.
    from radixlm.model.loader import load_tokenizer

    history = [
        {"role": "user", "content": USER},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris", "unit": "celsius"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}
            ],
        },
    ]
    openai_form = [
        {"role": "user", "content": USER},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"},
    ]
    want = load_tokenizer().apply_chat_template(
        openai_form, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert claude.messages.count_tokens(model=model, messages=history).input_tokens == len(want)


def test_tool_use_round_trip(claude, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    msg = claude.messages.create(
        model=model,
        max_tokens=60,
        tools=[WEATHER],
        **GREEDY,
        tool_choice={"type": "any"},
        messages=ask,
    )
    assert msg.stop_reason == "tool_use"
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert calls and all(c.name == "get_weather" and c.id for c in calls)
    for c in calls:
        jsonschema.validate(c.input, WEATHER["input_schema"])
    # Streamed, the input_json_delta pieces assemble to the same calls.
    with claude.messages.stream(
        model=model,
        max_tokens=60,
        tools=[WEATHER],
        **GREEDY,
        tool_choice={"type": "any"},
        messages=ask,
    ) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        (c.name, c.input) for c in calls
    ]
    results = [
        {
            "type": "tool_result",
            "tool_use_id": c.id,
            "content": [{"type": "text", "text": "18 C, sunny"}],
        }
        for c in calls
    ]
    answer = claude.messages.create(
        model=model,
        max_tokens=30,
        tools=[WEATHER],
        **GREEDY,
        messages=[
            *ask,
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in msg.content],
            },
            {"role": "user", "content": results},
        ],
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()


def post(server, body, path="/v1/messages", key=KEY):
    return requests.post(
        server.url + path,
        json=body,
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        timeout=60,
    )


def assert_error(r, status, kind, *words):
    assert r.status_code == status, r.text
    body = r.json()
    assert (
        body["type"] == "error" and body["error"]["type"] == kind and set(body) == {"type", "error"}
    )
    for w in words:
        assert w in body["error"]["message"], body


def test_errors_in_anthropics_shape(server, claude, model):
    user = {"role": "user", "content": USER}
    assert_error(
        post(server, {"model": model, "messages": [user]}),
        400,
        "invalid_request_error",
        "max_tokens",
    )
    assert_error(
        post(
            server,
            {"model": model, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
        ),
        400,
        "invalid_request_error",
        "messages.0.role",
    )
    orphan = [
        user,
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "1"}],
        },
    ]
    assert_error(
        post(server, {"model": model, "max_tokens": 4, "messages": orphan}),
        400,
        "invalid_request_error",
        "messages.2.content.0.tool_use_id",
        "toolu_nope",
    )
    image = {
        "role": "user",
        "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}],
    }
    assert_error(
        post(server, {"model": model, "max_tokens": 4, "messages": [image]}),
        400,
        "invalid_request_error",
        "images are not supported",
        "messages.0.content.0",
    )
    assert_error(
        post(
            server,
            {
                "model": model,
                "max_tokens": 4,
                "messages": [user],
                "tool_choice": {"type": "tool", "name": "nope"},
                "tools": [WEATHER],
            },
        ),
        400,
        "invalid_request_error",
        "tool_choice.name",
    )
    assert_error(
        post(
            server,
            {"model": model, "max_tokens": 4, "messages": [user], "stream": True, "top_k": -5},
        ),
        400,
        "invalid_request_error",
        "top_k",
    )
    assert_error(
        post(
            server, {"model": model, "messages": [user]}, "/v1/messages/count_tokens", key="wrong"
        ),
        401,
        "authentication_error",
    )
    with pytest.raises(
        anthropic.BadRequestError, match="--reasoning-parser"
    ):  # this server has none
        claude.messages.create(
            model=model,
            max_tokens=4,
            messages=[user],
            thinking={"type": "enabled", "budget_tokens": 2},
        )
    assert (
        claude.messages.create(model=model, max_tokens=2, messages=[user]).usage.output_tokens == 2
    )


# ------------------------------------------------------------------ thinking
@pytest.fixture(scope="module")
def thinking_server(reasoning_server):
    """The tiny model with --reasoning-parser qwen3, shared with test_thinking (conftest)."""
    return reasoning_server


def test_thinking_budget_is_the_chat_routes(thinking_server):
    """thinking.budget_tokens runs as the chat route's max_thinking_tokens (the think block closed
    after that many tokens); disabled as the format's switch off (Qwen3's enable_thinking)."""
    url = thinking_server.url
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Is the sky blue?"}]

    def chat(**extra):
        m = (
            oai.chat.completions.create(
                model="m", messages=ask, max_tokens=20, temperature=0, extra_body=extra
            )
            .choices[0]
            .message
        )
        return (m.model_extra.get("reasoning_content") or "") + (m.content or "")

    def message(thinking):
        msg = claude.messages.create(
            model="m", max_tokens=20, messages=ask, thinking=thinking, **GREEDY
        )
        return "".join(b.thinking if b.type == "thinking" else b.text for b in msg.content)

    budgeted = message({"type": "enabled", "budget_tokens": 5})
    assert budgeted == chat(max_thinking_tokens=5) != chat()  # the budget cut the block
    assert message({"type": "disabled"}) == chat(chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(anthropic.BadRequestError, match="thinking.budget_tokens"):
        claude.messages.create(
            model="m", max_tokens=5, messages=ask, thinking={"type": "enabled", "budget_tokens": 5}
        )
