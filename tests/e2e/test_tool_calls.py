"""Tool calling on /v1/chat/completions through the official `openai` client, on the default
model (SmolLM2-135M, whose chatml template ignores `tools`: the server lists them in a system
message and parses <tool_call> blocks; docs/agents.md).

tool_choice required / named are forced by a grammar over the tools' JSON schemas, so every call
validates (jsonschema) even on this small model; the stream, assembled, equals the whole answer;
an agent's second turn reuses the first turn's prompt from the radix cache."""

import json

import jsonschema
import openai
import pytest

S = {
    "type": "string",
    "maxLength": 24,
}  # bounded strings: a greedy small model may not stop on its own


def fn(name, description, properties, required=None):
    params = {"type": "object", "properties": properties, "required": required or list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


TOOLS = [
    fn(
        "get_weather",
        "Current weather in a city",
        {"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ),
    fn(
        "add",
        "Add two integers",
        {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
        },
    ),
    fn(
        "send_email",
        "Send an email",
        {"to": S, "subject": S, "urgent": {"type": "boolean"}},
        ["to", "subject"],
    ),
    fn(
        "search_web",
        "Search the web",
        {"query": S, "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
    ),
    fn(
        "book_flight",
        "Book a flight",
        {
            "origin": S,
            "destination": S,
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
        },
    ),
    fn(
        "create_event",
        "Create a calendar event",
        {
            "title": S,
            "when": {
                "type": "object",
                "properties": {
                    "day": {"type": "integer", "minimum": 1, "maximum": 31},
                    "month": {"type": "integer", "minimum": 1, "maximum": 12},
                },
                "required": ["day", "month"],
            },
        },
    ),
    fn(
        "set_timer", "Start a timer", {"minutes": {"type": "integer", "minimum": 1, "maximum": 120}}
    ),
    fn(
        "translate",
        "Translate a text",
        {"text": S, "target": {"type": "string", "enum": ["fr", "de", "es", "ja"]}},
    ),
    fn(
        "convert_currency",
        "Convert money",
        {
            "amount": {"type": "number", "minimum": 0, "maximum": 100000},
            "from": {"type": "string", "enum": ["USD", "EUR", "JPY"]},
            "to": {"type": "string", "enum": ["USD", "EUR", "JPY"]},
        },
    ),
    fn(
        "add_todo",
        "Add items to the to-do list",
        {"items": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
    ),
    fn(
        "get_stock_price",
        "Stock price of a ticker",
        {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}},
    ),
    fn(
        "set_thermostat",
        "Set the thermostat",
        {
            "temperature": {"type": "number", "minimum": 10, "maximum": 30},
            "mode": {"type": "string", "enum": ["heat", "cool", "auto"]},
        },
    ),
    fn("play_music", "Play music", {"artist": S, "shuffle": {"type": "boolean"}}, ["artist"]),
    fn(
        "order_pizza",
        "Order pizza",
        {
            "size": {"type": "string", "enum": ["small", "medium", "large"]},
            "toppings": {
                "type": "array",
                "items": {"type": "string", "enum": ["cheese", "ham", "mushroom", "olive"]},
                "maxItems": 3,
            },
        },
    ),
    fn(
        "find_restaurant",
        "Find a restaurant",
        {
            "location": {
                "type": "object",
                "properties": {"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city"],
            },
            "cuisine": S,
        },
        ["location"],
    ),
    fn(
        "rate_movie",
        "Rate a movie",
        {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
    ),
    fn("lookup_word", "Dictionary lookup", {"word": S}),
    fn(
        "schedule_meeting",
        "Schedule a meeting",
        {
            "attendees": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": S, "optional": {"type": "boolean"}},
                    "required": ["name"],
                },
                "minItems": 1,
                "maxItems": 2,
            },
            "duration_minutes": {"type": "integer", "enum": [15, 30, 60]},
        },
    ),
    fn(
        "resize_image",
        "Resize an image",
        {
            "width": {"type": "integer", "minimum": 1, "maximum": 4096},
            "height": {"type": "integer", "minimum": 1, "maximum": 4096},
            "keep_ratio": {"type": "boolean"},
        },
    ),
    fn(
        "get_time",
        "Current time in a timezone",
        {"timezone": {"type": "string", "enum": ["UTC", "Europe/Paris", "Asia/Tokyo"]}},
    ),
]
PROMPTS = [
    "What's the weather in Paris in celsius?",
    "What is 12 plus 30?",
    "Email bob@x.org about the launch, urgent.",
    "Search the web for radix trees, 3 results.",
    "Book 2 business seats from Oslo to Rome.",
    "Put 'Dentist' on my calendar for March 3.",
    "Set a timer for 10 minutes.",
    "Translate 'good morning' to German.",
    "Convert 50 USD to EUR.",
    "Add milk and eggs to my to-do list.",
    "What's the price of AAPL?",
    "Set the heating to 21 degrees.",
    "Play some Miles Davis, shuffled.",
    "Order a large pizza with ham and olives.",
    "Find a sushi place in Boston 02110.",
    "Rate Alien five stars.",
    "What does 'ephemeral' mean?",
    "Set up a 30 minute meeting with Ann.",
    "Resize the image to 800 by 600 keeping the ratio.",
    "What time is it in Tokyo?",
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MAX = 120  # every forced call here fits; a cut-off call would fail the validation below


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def ask(client, prompt, **kw):
    kw = {"temperature": 0, "max_tokens": MAX, "tools": TOOLS, **kw}
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], **kw
    )


def assembled(client, prompt, **kw):
    """The streamed answer: {index: [id, name, arguments]}, the content and the finish reason."""
    calls, content, finish = {}, "", None
    for chunk in ask(client, prompt, stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or []:
                if tc.id is not None:  # the call's first delta: id, type and name
                    assert (
                        tc.index not in calls
                        and tc.type == "function"
                        and tc.function.arguments == ""
                    )
                    calls[tc.index] = [tc.id, tc.function.name, ""]
                else:
                    assert tc.function.name is None
                    calls[tc.index][2] += tc.function.arguments
    return calls, content, finish


def check_calls(message, names):
    assert message.tool_calls, message
    for tc in message.tool_calls:
        assert tc.type == "function" and tc.id.startswith("call_") and tc.function.name in names
        jsonschema.validate(json.loads(tc.function.arguments), SCHEMAS[tc.function.name])
    return [(tc.function.name, tc.function.arguments) for tc in message.tool_calls]


@pytest.mark.parametrize("i", range(len(TOOLS)))
def test_named_tool_choice_gives_valid_calls_streamed_or_not(client, i):
    name = TOOLS[i]["function"]["name"]
    choice = {"type": "function", "function": {"name": name}}
    r = ask(client, PROMPTS[i], tool_choice=choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    whole = check_calls(c.message, {name})
    calls, content, finish = assembled(client, PROMPTS[i], tool_choice=choice)
    assert finish == "tool_calls" and content == ""
    assert [(n, a) for _, n, a in calls.values()] == whole
    assert sorted(calls) == list(range(len(whole)))


@pytest.mark.parametrize("i", [0, 4, 9, 14, 17])
def test_required_tool_choice_gives_valid_calls_streamed_or_not(client, i):
    # One call (parallel_tool_calls false): this small model, free to add calls, repeats its call
    # until max_tokens (test_parallel_tool_calls shows several).
    kw = dict(tool_choice="required", parallel_tool_calls=False)
    r = ask(client, PROMPTS[i], **kw)
    whole = check_calls(r.choices[0].message, set(SCHEMAS))
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    calls, content, finish = assembled(client, PROMPTS[i], **kw)
    assert (
        finish == "tool_calls" and content == "" and [(n, a) for _, n, a in calls.values()] == whole
    )


def test_parallel_tool_calls(client):
    # "]" made unlikely, so the grammar's choice between another call and the end shows: several
    # calls when parallel_tool_calls allows them, exactly one when it is false.
    from radixlm.model.loader import default_model_path, load_tokenizer

    tok = load_tokenizer(default_model_path())
    close = [i for t, i in tok.get_vocab().items() if "]" in tok.convert_tokens_to_string([t])]
    kw = dict(tool_choice="required", tools=TOOLS[:1], logit_bias={str(i): -100 for i in close})
    prompt = "What's the weather in Paris and in Tokyo?"
    several = ask(client, prompt, **kw).choices[0].message
    assert len(check_calls(several, {"get_weather"})) >= 2
    one = ask(client, prompt, parallel_tool_calls=False, **kw).choices[0].message
    assert len(check_calls(one, {"get_weather"})) == 1


def test_agent_loop_second_turn_reuses_the_first(fresh_server, client):
    # fresh_server: the shared server's cache flushed, so only the first turn can have cached the
    # second's prefix.
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = client.chat.completions.create(
        model="m",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=MAX,
    )
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18})},
    ]
    second = client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, temperature=0, max_tokens=24
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_auto_call_follows_the_history(client):
    # tool_choice auto: the history shows a call (written as a <tool_call> block for this
    # template); asked again, the model opens one itself and the structural tag completes it by
    # the function's schema. Streamed and not, the same call.
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    }
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
        {"role": "assistant", "content": "It is 18 degrees in Paris."},
        {"role": "user", "content": "What's the weather in Tokyo?"},
    ]
    kw = dict(model="m", messages=messages, tools=TOOLS, temperature=0, max_tokens=60)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    whole = check_calls(r.choices[0].message, set(SCHEMAS))
    calls = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            calls.setdefault(tc.index, [tc.function.name, ""])[1] += tc.function.arguments or ""
    assert [tuple(c) for c in calls.values()] == whole


@pytest.mark.parametrize(
    "kw, param",
    [
        (dict(tool_choice="required", tools=None), "tool_choice"),
        (
            dict(tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice.function.name",
        ),
        (
            dict(tools=[fn("f", "bad", {"x": {"type": "frobnicate"}})]),
            "tools[0].function.parameters",
        ),
        (
            dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
            "tools[0].function.name",
        ),
        (dict(tool_choice="sometimes"), "tool_choice"),
        (dict(tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
    ],
)
def test_bad_tool_fields_are_400_naming_the_field(client, server, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "hi", **kw)
    assert e.value.body["param"] == param, e.value.body
    assert ask(client, "hi", max_tokens=2).choices[0].message is not None  # still serving


def test_tool_message_without_a_matching_call_is_400(client):
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_b", "content": "??"},
    ]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=2)
    assert e.value.body["param"] == "messages[3].tool_call_id"
    messages[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages[:3], tools=TOOLS, max_tokens=2)
    assert e.value.body["param"] == "messages[1].tool_calls[0].function.arguments"


def test_docs_example_runs(server, tmp_path):
    """docs/agents.md's example, as pasted into a script, against this server."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    code = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)[
        0
    ]  # the second: test_agents_sdk.py
    script = tmp_path / "agents_example.py"
    script.write_text(code.replace("http://127.0.0.1:30000", server.url))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    finish, name, args = lines[0].split(" ", 2)
    assert (finish, name) == ("tool_calls", "get_weather")
    import ast

    jsonschema.validate(
        ast.literal_eval(args), SCHEMAS["get_weather"] | {"required": ["city", "unit"]}
    )
    cached, total = map(int, re.fullmatch(r"cached: (\d+) of (\d+)", lines[-1]).groups())
    assert 0 < cached < total
