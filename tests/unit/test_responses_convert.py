"""The Responses API adapter's converters (server/responses_*.py) on hand-written chat bodies and
chunk sequences as OpenAI's chat API defines them, checked against the `openai` client's own
Responses types; the input-item translation; the response store's bounds."""

import json

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from radixlm.server.openai_protocol import RequestError
from radixlm.server.responses_output import (
    EventStream,
    Shell,
    assistant_message,
    echo_fields,
    response_body,
)
from radixlm.server.responses_protocol import ResponsesRequest, chat_messages, chat_request_body
from radixlm.server.responses_store import ResponseStore, StoredResponse

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {
        "id": "call_b",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"tz": "CET"}'},
    },
]
MESSAGE = {
    "role": "assistant",
    "reasoning_content": "The user wants weather.",
    "content": "Let me check.",
    "tool_calls": CALLS,
}
USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 12,
    "total_tokens": 42,
    "prompt_tokens_details": {"cached_tokens": 20},
}


def shell() -> Shell:
    req = ResponsesRequest.model_validate({"input": "hi", "instructions": "Be brief."})
    return Shell("resp_1", "m", echo_fields(req, None, None))


def chat_body(message: dict, finish: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "usage": USAGE,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def chunks_of(message: dict, finish: str) -> list[dict]:
    """OpenAI's chunk sequence for `message`: role first, reasoning and content in pieces, each
    call's id and name first and its arguments in pieces, the finish, then the usage chunk."""

    def ch(delta, reason=None):
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
        }

    out = [ch({"role": "assistant", "content": ""})]
    for field in ("reasoning_content", "content"):
        text = message.get(field) or ""
        out += [ch({field: text[i : i + 3]}) for i in range(0, len(text), 3)]
    for k, c in enumerate(message.get("tool_calls") or []):
        out.append(
            ch(
                {
                    "tool_calls": [
                        {
                            "index": k,
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        args = c["function"]["arguments"]
        out += [
            ch({"tool_calls": [{"index": k, "function": {"arguments": args[i : i + 4]}}]})
            for i in range(0, len(args), 4)
        ]
    out.append(ch({}, finish))
    out.append({**ch({}), "choices": [], "usage": USAGE})
    return out


def strip_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in it.items() if k != "id"} for it in items]


@pytest.mark.parametrize(
    "message,finish",
    [
        (MESSAGE, "tool_calls"),
        ({"role": "assistant", "content": "Paris is the capital."}, "stop"),
        ({"role": "assistant", "content": "Paris is"}, "length"),
        ({"role": "assistant", "content": ""}, "stop"),
    ],
)
def test_body_and_stream_agree_and_match_openai_types(message, finish):
    body = response_body(shell(), chat_body(message, finish))
    resp = Response.model_validate(body)
    kinds = [it.type for it in resp.output]
    calls = message.get("tool_calls") or []
    assert kinds == (["reasoning"] if message.get("reasoning_content") else []) + (
        ["message"] if message["content"] or not calls else []
    ) + ["function_call"] * len(calls)
    assert resp.output_text == message["content"]
    assert [(c.call_id, c.name, c.arguments) for c in resp.output if c.type == "function_call"] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls
    ]
    assert resp.usage.input_tokens == 30 and resp.usage.input_tokens_details.cached_tokens == 20
    assert resp.status == ("incomplete" if finish == "length" else "completed")
    assert (resp.incomplete_details.reason if resp.incomplete_details else None) == (
        "max_output_tokens" if finish == "length" else None
    )

    es = EventStream(shell())
    events = es.start()
    for c in chunks_of(message, finish):
        events += es.chunk(c)
    events += es.finish()
    parsed = [EVENT.validate_python(e) for e in events]  # every event is one the client knows
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    types = [e.type for e in parsed]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == ("response.incomplete" if finish == "length" else "response.completed")
    # Every item: added, its deltas, its done events, output_item.done, before the next is added.
    added = [i for i, t in enumerate(types) if t == "response.output_item.added"]
    done = [i for i, t in enumerate(types) if t == "response.output_item.done"]
    assert len(added) == len(done) == len(body["output"]) and all(
        a < d for a, d in zip(added, done)
    )
    assert all(d < a for d, a in zip(done, added[1:]))
    final = parsed[-1].response
    assert strip_ids(final.model_dump()["output"]) == strip_ids(resp.model_dump()["output"])
    assert final.usage == resp.usage
    text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    assert text == message["content"]
    for item in final.output:
        if item.type == "function_call":
            pieces = [
                e.delta
                for e in parsed
                if e.type == "response.function_call_arguments.delta" and e.item_id == item.id
            ]
            fin = [
                e
                for e in parsed
                if e.type == "response.function_call_arguments.done" and e.item_id == item.id
            ]
            assert "".join(pieces) == item.arguments == fin[0].arguments
    # The continuation renders the same assistant turn the chat API would have sent back.
    back = assistant_message(body["output"])
    assert back["content"] == message["content"] and back.get("tool_calls", []) == calls


def test_stream_error_after_start_is_an_error_then_failed_event():
    es = EventStream(shell())
    events = (
        es.start()
        + es.chunk(chunks_of({"content": "Hi"}, "stop")[1])
        + list(es.failed(500, "internal error"))
    )
    parsed = [EVENT.validate_python(e) for e in events]
    assert [e.type for e in parsed][-2:] == ["error", "response.failed"]
    assert (
        parsed[-1].response.status == "failed"
        and parsed[-1].response.error.message == "internal error"
    )


def test_input_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather"},
                {"type": "input_text", "text": "in Paris?"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {
            "type": "function_call",
            "call_id": "call_b",
            "name": "get_time",
            "arguments": '{"tz": "CET"}',
        },
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {
            "type": "function_call_output",
            "call_id": "call_b",
            "output": [{"type": "input_text", "text": "noon"}],
        },
    ]
    assert chat_messages(items, []) == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "noon"},
    ]
    # A call made in the stored conversation may be answered in the next request.
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": CALLS[:1]},
    ]
    assert chat_messages(
        [{"type": "function_call_output", "call_id": "call_a", "output": "ok"}], history
    ) == [{"role": "tool", "tool_call_id": "call_a", "content": "ok"}]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": 5}, "input"),
        (
            {"input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]},
            "input.0.call_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input.0.content.0.type",
        ),
        ({"input": [{"type": "web_search_call"}]}, "input.0.type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": "hi", "tool_choice": {"type": "mcp"}}, "tool_choice"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        (
            {
                "input": "hi",
                "tools": [
                    {
                        "type": "custom",
                        "name": "apply_patch",
                        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /x/"},
                    }
                ],
            },
            "tools.0.format",
        ),
        ({"input": "hi", "tools": [{"type": "custom"}]}, "tools.0.name"),
        (
            {"input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}]},
            "input.0.input",
        ),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "truncation": "auto"}, "truncation"),
        ({"input": []}, "input"),
    ],
)
def test_bad_input_names_the_field(body, param):
    with pytest.raises(RequestError) as e:
        chat_request_body(ResponsesRequest.model_validate(body), [])
    assert e.value.param == param


def test_request_translation():
    req = ResponsesRequest.model_validate(
        {
            "input": "hi",
            "instructions": "Be brief.",
            "max_output_tokens": 9,
            "temperature": 0.5,
            "top_p": 0.9,
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
            ],
            "tool_choice": {"type": "function", "name": "f"},
            "reasoning": {"effort": "low"},
            "stream": True,
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "s",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
        }
    )
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    body, conversation = chat_request_body(req, history)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        *history,
        {"role": "user", "content": "hi"},
    ]
    assert conversation == body["messages"][1:]  # instructions are not carried over
    assert (
        body["max_completion_tokens"] == 9 and body["temperature"] == 0.5 and body["top_p"] == 0.9
    )
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True},
    }
    assert body["chat_template_kwargs"] == {"reasoning_effort": "low"}
    assert body["stream_options"] == {"include_usage": True}
    json.dumps(body)


def test_store_bounds_ttl_and_owners():
    now = [0.0]
    store = ResponseStore(capacity=2, ttl=10, clock=lambda: now[0])
    for i in range(3):
        store.put(f"r{i}", StoredResponse("a", {"i": i}, []))
    assert store.get("r0", "a") is None and store.get("r1", "a").body == {
        "i": 1
    }  # least recently used out
    assert store.get("r2", "b") is None and not store.delete("r2", "b")  # another key: as if absent
    now[0] = 9.0
    assert store.get("r2", "a") is not None  # a use renews it
    now[0] = 15.0
    assert store.get("r1", "a") is None and store.get("r2", "a") is not None  # r1 expired at 11
    assert store.delete("r2", "a") and store.get("r2", "a") is None and len(store) == 0
    off = ResponseStore(capacity=0, ttl=1)
    off.put("x", StoredResponse("a", {}, []))
    assert off.get("x", "a") is None
    with pytest.raises(ValueError):
        ResponseStore(capacity=1, ttl=0)


def test_codex_include_of_encrypted_reasoning_is_accepted_and_others_refused():
    """Codex sends include ["reasoning.encrypted_content"] to reasoning models: served; any other
    include value is a 400 naming it."""
    ok = ResponsesRequest(input="hi", include=["reasoning.encrypted_content"])
    body, _ = chat_request_body(ok, [])
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    bad = ResponsesRequest(input="hi", include=["message.output_text.logprobs"])
    with pytest.raises(RequestError) as e:
        chat_request_body(bad, [])
    assert "message.output_text.logprobs" in str(e.value)


PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hello "world"\n*** End Patch'


def custom_shell() -> Shell:
    tools = [
        {"type": "custom", "name": "apply_patch", "description": "Edit files."},
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    ]
    req = ResponsesRequest.model_validate({"input": "hi", "tools": tools})
    return Shell("resp_2", "m", echo_fields(req, tools, None))


def test_custom_tools_round_trip_as_openai_defines_them():
    """A custom (free-form) tool: a function of one string `input` for the template; its call a
    custom_tool_call item with that text (body and stream alike, both valid openai types); the
    item back in the next request renders the same function call."""
    body, _ = chat_request_body(custom_shell_request(), [])
    fn = body["tools"][0]["function"]
    assert fn["name"] == "apply_patch" and fn["parameters"]["required"] == ["input"]
    assert fn["description"].startswith("Edit files.")
    assert body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    calls = [
        {
            "id": "call_p",
            "type": "function",
            "function": {"name": "apply_patch", "arguments": json.dumps({"input": PATCH})},
        },
        CALLS[0] | {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    ]
    message = {"role": "assistant", "content": "", "tool_calls": calls}
    resp = Response.model_validate(response_body(custom_shell(), chat_body(message, "tool_calls")))
    custom = [it for it in resp.output if it.type == "custom_tool_call"]
    assert [(c.call_id, c.name, c.input) for c in custom] == [("call_p", "apply_patch", PATCH)]
    assert [it.type for it in resp.output] == ["custom_tool_call", "function_call"]

    es = EventStream(custom_shell())
    events = es.start()
    for c in chunks_of(message, "tool_calls"):
        events += es.chunk(c)
    events += es.finish()
    parsed = [EVENT.validate_python(e) for e in events]
    final = parsed[-1].response
    assert strip_ids(final.model_dump()["output"]) == strip_ids(resp.model_dump()["output"])
    deltas = [e.delta for e in parsed if e.type == "response.custom_tool_call_input.delta"]
    done = [e.input for e in parsed if e.type == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == PATCH and done == [PATCH]
    fc_id = next(it.id for it in final.output if it.type == "function_call")
    assert {e.item_id for e in parsed if e.type.startswith("response.function_call_arg")} == {fc_id}

    back = assistant_message(resp.model_dump()["output"])
    assert back["tool_calls"][0] == calls[0]
    items = [
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
    ]
    assert chat_messages(items, []) == [
        {"role": "assistant", "content": "", "tool_calls": calls[:1]},
        {"role": "tool", "tool_call_id": "call_p", "content": "Done!"},
    ]


def custom_shell_request() -> ResponsesRequest:
    return ResponsesRequest.model_validate(
        {
            "input": "Add a file.",
            "tools": [
                {"type": "custom", "name": "apply_patch", "description": "Edit files.",
                 "format": {"type": "text"}},
            ],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
    )  # fmt: skip
