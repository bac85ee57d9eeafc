"""The Messages API adapter's converters on hand-written OpenAI shapes (chat.completion bodies and
chat.completion.chunk sequences as OpenAI defines them, tool calls and reasoning_content
included), with the `anthropic` client's own stream accumulator as the reference for the events;
and the request translation (anthropic_protocol.chat_body) on Anthropic's content blocks."""

import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from radixlm.server.anthropic_convert import StreamConverter, message_from_chat
from radixlm.server.anthropic_protocol import MessagesRequest, chat_body
from radixlm.server.openai_protocol import RequestError

USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 12,
    "total_tokens": 42,
    "prompt_tokens_details": {"cached_tokens": 8},
}
CALLS = [
    ("call_a", "get_weather", {"city": "Paris", "unit": "celsius"}),
    ("call_b", "get_time", {"tz": "CET"}),
]


def body(message: dict, finish: str, matched=None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "usage": USAGE,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": finish,
                "matched_stop": matched,
            }
        ],
    }


def chunk(delta: dict, finish=None, matched=None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": matched,
            }
        ],
    }


def tool_call_chunks() -> list[dict]:
    """OpenAI's streamed tool calls: per call, index + id + type + name first, then argument
    pieces."""
    out = []
    for i, (cid, name, args) in enumerate(CALLS):
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": cid,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        text = json.dumps(args)
        for k in range(0, len(text), 5):
            out.append(
                chunk({"tool_calls": [{"index": i, "function": {"arguments": text[k : k + 5]}}]})
            )
    return out


def run_stream(chunks: list[dict], stops=()) -> tuple[list[dict], Message]:
    conv = StreamConverter("m", list(stops))
    events = conv.start()
    for c in chunks:
        events += conv.feed(c)
    events += conv.finish()
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for e in events:
        snapshot = accumulate_event(
            event=adapter.validate_python(e), current_snapshot=snapshot, json_bufs=bufs
        )
    return events, snapshot


def test_body_with_reasoning_text_and_tool_calls():
    calls = [
        {"id": cid, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for cid, n, a in CALLS
    ]
    msg = message_from_chat(
        body(
            {"content": "Checking.", "reasoning_content": "Need weather.", "tool_calls": calls},
            "tool_calls",
        ),
        "m",
        [],
    )
    Message.model_validate(msg)
    assert msg["id"].startswith("msg_") and msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"] == [
        {"type": "thinking", "thinking": "Need weather.", "signature": ""},
        {"type": "text", "text": "Checking."},
        *({"type": "tool_use", "id": cid, "name": n, "input": a} for cid, n, a in CALLS),
    ]
    assert msg["stop_reason"] == "tool_use" and msg["stop_sequence"] is None
    assert msg["usage"] == {
        "input_tokens": 22,
        "output_tokens": 12,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
    }


@pytest.mark.parametrize(
    "finish,matched,stops,want",
    [
        ("length", None, [], ("max_tokens", None)),
        ("stop", 2, [], ("end_turn", None)),  # EOS token
        (
            "stop",
            "<|im_end|>",
            ["END"],
            ("end_turn", None),
        ),  # a template's stop string, not the request's
        ("stop", "END", ["END"], ("stop_sequence", "END")),
    ],
)
def test_stop_reasons(finish, matched, stops, want):
    msg = message_from_chat(body({"content": "x"}, finish, matched), "m", stops)
    assert (msg["stop_reason"], msg["stop_sequence"]) == want
    events, final = run_stream(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "x"}),
            chunk({}, finish, matched),
        ],
        stops,
    )
    assert (final.stop_reason, final.stop_sequence) == want


def test_stream_order_and_assembly():
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"reasoning_content": p}) for p in ("Need ", "weather.")),
        *(chunk({"content": p}) for p in ("Check", "ing.")),
        *tool_call_chunks(),
        chunk({}, "tool_calls"),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [],
            "usage": USAGE,
        },
    ]
    events, final = run_stream(chunks)
    kinds = [(e["type"], e.get("index")) for e in events]
    # Four blocks (thinking, text, two tool calls), each start, deltas, stop, in index order.
    starts = [i for i, (t, _) in enumerate(kinds) if t == "content_block_start"]
    stops = [i for i, (t, _) in enumerate(kinds) if t == "content_block_stop"]
    assert kinds[0] == ("message_start", None) and kinds[-2:] == [
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert len(starts) == len(stops) == 4
    for b, (s, e) in enumerate(zip(starts, stops)):
        assert kinds[s][1] == kinds[e][1] == b
        assert all(k == ("content_block_delta", b) for k in kinds[s + 1 : e])
        assert b == 0 or stops[b - 1] < s
    want = message_from_chat(
        body(
            {
                "content": "Checking.",
                "reasoning_content": "Need weather.",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": n, "arguments": json.dumps(a)},
                    }
                    for cid, n, a in CALLS
                ],
            },
            "tool_calls",
        ),
        "m",
        [],
    )
    got = final.model_dump(exclude_none=True)
    assert got["content"] == want["content"] and got["stop_reason"] == "tool_use"
    assert got["usage"] == want["usage"]


def test_forced_call_with_finish_stop_is_tool_use():
    """OpenAI reports finish_reason "stop" for a named tool_choice; Anthropic says tool_use."""
    cid, name, args = CALLS[0]
    msg = message_from_chat(
        body(
            {
                "content": None,
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            },
            "stop",
        ),
        "m",
        [],
    )
    assert msg["stop_reason"] == "tool_use" and [b["type"] for b in msg["content"]] == ["tool_use"]
    events, final = run_stream(
        [
            chunk({"role": "assistant", "content": ""}),
            *tool_call_chunks()[: 1 + 3],
            chunk({}, "stop"),
        ]
    )
    assert final.stop_reason == "tool_use"


def test_stream_without_output_closes_cleanly():
    events, final = run_stream([chunk({"role": "assistant", "content": ""}), chunk({}, "length")])
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert final.content == [] and final.stop_reason == "max_tokens"


def request(**kw) -> dict:
    return chat_body(MessagesRequest.model_validate({"max_tokens": 8, **kw}))


def test_request_translation():
    got = request(
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        stop_sequences=["Z"],
        top_k=3,
        tools=[{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        messages=[
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "boom"}],
                    },
                    {"type": "text", "text": "again"},
                ],
            },
        ],
    )
    assert got["messages"] == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    assert got["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "description": "d"},
        }
    ]
    assert (
        got["tool_choice"] == {"type": "function", "function": {"name": "f"}}
        and got["parallel_tool_calls"] is False
    )
    assert (got["stop"], got["top_k"], got["max_tokens"]) == (["Z"], 3, 8)
    assert (
        request(
            messages=[{"role": "user", "content": "q"}],
            tools=[{"name": "f", "input_schema": {}}],
            tool_choice={"type": "any"},
        )["tool_choice"]
        == "required"
    )
    # Anthropic's prefill: a final assistant turn is continued.
    assert (
        request(
            messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "The"}]
        )["continue_final_message"]
        is True
    )


@pytest.mark.parametrize(
    "messages,param",
    [
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}],
                }
            ],
            "messages.0.content.0.tool_use_id",
        ),
        (
            [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            "messages.0.content.0",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
                }
            ],
            "messages.0.content.0.type",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                }
            ],
            "messages.0.content.0.input",
        ),
    ],
)
def test_bad_blocks_are_named(messages, param):
    with pytest.raises(RequestError) as e:
        request(messages=messages)
    assert e.value.param == param


def test_thinking_translation():
    user = [{"role": "user", "content": "q"}]
    on = chat_body(
        MessagesRequest.model_validate(
            {
                "max_tokens": 50,
                "messages": user,
                "thinking": {"type": "enabled", "budget_tokens": 20},
            }
        ),
        "qwen3",
    )
    assert on["max_thinking_tokens"] == 20 and on["chat_template_kwargs"] == {
        "enable_thinking": True
    }
    off = chat_body(
        MessagesRequest.model_validate(
            {"max_tokens": 50, "messages": user, "thinking": {"type": "disabled"}}
        ),
        "qwen3",
    )
    assert "max_thinking_tokens" not in off and off["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    assert "chat_template_kwargs" not in request(
        messages=user, thinking={"type": "disabled"}
    )  # no parser
    with pytest.raises(RequestError) as e:
        request(messages=user, thinking={"type": "enabled", "budget_tokens": 4})
    assert e.value.param == "thinking" and "--reasoning-parser" in str(e.value)
    with pytest.raises(RequestError) as e:
        chat_body(
            MessagesRequest.model_validate(
                {
                    "max_tokens": 8,
                    "messages": user,
                    "thinking": {"type": "enabled", "budget_tokens": 8},
                }
            ),
            "qwen3",
        )
    assert e.value.param == "thinking.budget_tokens"


# Claude Code's billing line (server/billing_header.py): the shapes its issue threads show.
BILLING = [
    (
        "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch=36ee5;",
        "x-anthropic-billing-header: cc_version=2.1.177.000; cc_entrypoint=cli; cch=00000;",
    ),
    (  # joined with the identity line in one block (a proxy's merge)
        "x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=sdk-cli; cch=eb6c6;"
        "\nYou are Claude Code",
        "x-anthropic-billing-header: cc_version=2.1.100.000; cc_entrypoint=sdk-cli; cch=00000;"
        "\nYou are Claude Code",
    ),
    (  # no fingerprint on the version: only cch changes
        "x-anthropic-billing-header: cc_version=2.1.29; cch=abcde;",
        "x-anthropic-billing-header: cc_version=2.1.29; cch=00000;",
    ),
]
UNCHANGED = [
    "x-anthropic-billing-header: cc_version=2.1.177.01c cc_entrypoint=cli cch=36ee5",  # no ;
    "x-anthropic-billing-header: cch=zz9x1;",  # not hex
    "x-anthropic-billing-header: garbage",
    "You are Claude Code. x-anthropic-billing-header: cch=36ee5;",  # not at the start
    "x-anthropic-billing-header: cch=36ee5; trailing words",  # not the whole line
]


@pytest.mark.parametrize("line, normalized", BILLING)
def test_billing_line_is_normalized(line, normalized):
    from radixlm.server.billing_header import normalize_billing_header

    assert normalize_billing_header(line) == normalized


@pytest.mark.parametrize("line", UNCHANGED)
def test_other_lines_are_left_as_they_came(line):
    from radixlm.server.billing_header import normalize_billing_header

    assert normalize_billing_header(line) == line


def test_chat_body_normalizes_only_system_blocks_and_only_when_asked():
    line, normalized = BILLING[0]
    req = MessagesRequest(
        model="m",
        max_tokens=4,
        system=[{"type": "text", "text": line}, {"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": line}],  # a user's text is never rewritten
    )
    on, off = chat_body(req)["messages"], chat_body(req, normalize_billing=False)["messages"]
    assert on[0] == {"role": "system", "content": normalized + "\nBe brief."}
    assert off[0] == {"role": "system", "content": line + "\nBe brief."}
    assert on[1] == off[1] == {"role": "user", "content": line}
    one = MessagesRequest(model="m", max_tokens=4, system=line, messages=[req.messages[0]])
    assert chat_body(one)["messages"][0]["content"] == normalized
