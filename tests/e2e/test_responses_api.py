"""OpenAI's Responses API (/v1/responses) through the official `openai` client on the tiny model
(the default model's tokenizer and chat template), against the same server's /v1/chat/completions
with the equivalent messages (the adapter must give the chat pipeline's answer); stored responses
per API key; a continued conversation served from the radix cache."""

import json

import jsonschema
import openai
import pytest
import requests

from radixlm.server.process import ServerProcess

USER, ADMIN = "user-key-0123456789", "admin-key-9876543210"
STORED = 4  # --max-stored-responses
GREEDY = {"temperature": 0, "max_output_tokens": 12}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
        "--max-stored-responses",
        str(STORED),
        env={"RADIXLM_API_KEY": USER, "RADIXLM_ADMIN_API_KEY": ADMIN},
    )
    yield s
    s.stop()


def client_of(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server):
    return client_of(server, USER)


def chat(client, messages: list, max_tokens: int = GREEDY["max_output_tokens"]):
    return client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_completion_tokens=max_tokens
    )


def test_create_is_the_chat_answer(client):
    instructions, question = "Answer in one short sentence.", "What is the capital of France?"
    r = client.responses.create(model="m", instructions=instructions, input=question, **GREEDY)
    ref = chat(
        client, [{"role": "system", "content": instructions}, {"role": "user", "content": question}]
    )
    want = ref.choices[0]
    assert r.id.startswith("resp_") and r.object == "response" and r.model == ref.model
    assert [it.type for it in r.output] == ["message"] and r.output[0].content[
        0
    ].type == "output_text"
    assert r.output_text == want.message.content and r.output_text
    assert r.status == ("incomplete" if want.finish_reason == "length" else "completed")
    if want.finish_reason == "length":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (
        ref.usage.prompt_tokens,
        ref.usage.completion_tokens,
    )
    assert r.instructions == instructions and r.max_output_tokens == GREEDY["max_output_tokens"]
    # The same conversation as input items (content parts) is the same prompt.
    items = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": instructions}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]},
    ]
    r2 = client.responses.create(model="m", input=items, store=False, **GREEDY)
    assert r2.output_text == r.output_text and r2.usage.input_tokens == r.usage.input_tokens


def test_stream_events_in_openai_order(client):
    kw = dict(model="m", input="Name three colors.", **GREEDY)
    plain = client.responses.create(store=False, **kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = types.count("response.output_text.delta")
    assert deltas >= 2, types
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ] + ["response.output_text.delta"] * deltas + [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{'completed' if plain.status == 'completed' else 'incomplete'}",
    ]
    final = events[-1].response
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta")
        == plain.output_text
    )
    assert final.output_text == plain.output_text and events[-4].text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    # Stored once finished, as streamed.
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_previous_response_id_reuses_the_cache(client):
    first, second = "My name is Ada. Say hello to me.", "What is my name?"
    r1 = client.responses.create(model="m", input=first, **GREEDY)
    r2 = client.responses.create(model="m", previous_response_id=r1.id, input=second, **GREEDY)
    # The earlier turn is rendered as it was: its whole prompt comes from the radix cache.
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens > 0
    assert r2.previous_response_id == r1.id
    ref = chat(
        client,
        [
            {"role": "user", "content": first},
            {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": second},
        ],
    )
    assert (
        r2.usage.input_tokens == ref.usage.prompt_tokens
        and r2.output_text == ref.choices[0].message.content
    )
    # A chain continues from the latest turn.
    r3 = client.responses.create(model="m", previous_response_id=r2.id, input="Thanks.", **GREEDY)
    assert r3.usage.input_tokens_details.cached_tokens >= r2.usage.input_tokens


def test_store_retrieve_delete_and_keys(server, client):
    other = client_of(server, ADMIN)
    kept = client.responses.create(model="m", input="Hi", max_output_tokens=2)
    assert client.responses.retrieve(kept.id).model_dump() == kept.model_dump()
    # Another key sees nothing: not to read, continue, cancel or delete.
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError) as e:
        other.responses.create(
            model="m", previous_response_id=kept.id, input="x", max_output_tokens=1
        )
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.cancel(kept.id)
    # A finished response cannot be cancelled (only background ones can, and none run here).
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(kept.id)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    # store=false: not kept.
    gone = client.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model="m", previous_response_id=gone.id, input="x", max_output_tokens=1
        )
    # Bounded: the least recently used goes first.
    ids = [
        client.responses.create(model="m", input=f"Count to {i}", max_output_tokens=1).id
        for i in range(STORED + 1)
    ]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_json_schema_text_format(client):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 16}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model="m",
        input="The capital of France, as JSON.",
        temperature=0,
        max_output_tokens=40,
        store=False,
        text={
            "format": {"type": "json_schema", "name": "capital", "schema": schema, "strict": True}
        },
    )
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), schema)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": 5}, "input"),
        ({"input": "hi", "unknown_field": 1}, "unknown_field"),
        ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "hi", "max_output_tokens": 10**6}, "max_output_tokens"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "y"}]},
            "input.0.call_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input.0.content.0.type",
        ),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
        ({"input": "hi", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "temperature": -1}, "temperature"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = requests.post(
        server.url + "/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {USER}"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_unknown_previous_response_is_a_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", previous_response_id="resp_nope", input="x")
    assert (
        e.value.body["param"] == "previous_response_id" and "resp_nope" in e.value.body["message"]
    )
    assert client.responses.create(
        model="m", input="Hi", max_output_tokens=1, store=False
    ).status  # still serving


def _call_of(response):
    calls = [it for it in response.output if it.type == "function_call"]
    assert calls, response.output
    return calls[0]


def test_function_tool_required_gives_a_valid_call_and_continues(client):
    """Needs tool calls in the chat pipeline (issue 48's tool-calling part)."""
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER,
            "strict": True,
        }
    ]
    kw = dict(
        model="m",
        input="What is the weather in Paris?",
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_output_tokens=60,
    )
    r = client.responses.create(**kw)
    call = _call_of(r)
    calls = [it for it in r.output if it.type == "function_call"]  # the model may make several
    for c in calls:
        assert c.name == "get_weather" and c.call_id
        jsonschema.validate(json.loads(c.arguments), WEATHER)
    events = list(client.responses.create(stream=True, store=False, **kw))
    streamed = [it for it in events[-1].response.output if it.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in calls]
    pieces: dict[int, str] = {}  # each call's argument deltas, by its output item
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            pieces[e.output_index] = pieces.get(e.output_index, "") + e.delta
    assert list(pieces.values()) == [c.arguments for c in calls]
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [
        c.arguments for c in calls
    ]
    # The tool's result continues the conversation from the cache (tool_choice "auto" renders the
    # tools as "required" did; "none" renders none, as SGLang, so its prompt would differ from the
    # start).
    r2 = client.responses.create(
        model="m",
        previous_response_id=r.id,
        tools=tools,
        temperature=0,
        max_output_tokens=8,
        tool_choice="auto",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens


def test_custom_tool_gives_free_form_input_and_continues(client):
    """A custom (free-form) tool, as Codex's apply_patch is declared: the forced call comes back
    as a custom_tool_call whose input is text (streamed alike), and its output continues the
    conversation from the cache."""
    tools = [
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Apply a patch to the repository's files.",
        }
    ]
    kw = dict(
        model="m",
        input="Add a file hello.txt that says hi.",
        tools=tools,
        tool_choice={"type": "custom", "name": "apply_patch"},
        temperature=0,
        max_output_tokens=60,
    )
    r = client.responses.create(**kw)
    calls = [it for it in r.output if it.type == "custom_tool_call"]
    assert calls and all(c.name == "apply_patch" and isinstance(c.input, str) for c in calls)
    assert not [it for it in r.output if it.type == "function_call"]
    events = list(client.responses.create(stream=True, store=False, **kw))
    streamed = [it for it in events[-1].response.output if it.type == "custom_tool_call"]
    assert [c.input for c in streamed] == [c.input for c in calls]
    assert [e.input for e in events if e.type == "response.custom_tool_call_input.done"] == [
        c.input for c in calls
    ]
    r2 = client.responses.create(
        model="m",
        previous_response_id=r.id,
        tools=tools,
        temperature=0,
        max_output_tokens=8,
        tool_choice="auto",
        input=[{"type": "custom_tool_call_output", "call_id": calls[0].call_id, "output": "Done"}],
    )
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens
