"""Ollama's API adapter on hand-written OpenAI chunk streams (ollama_convert.py), parsed back with
the official `ollama` client's own response models, and the request translation
(ollama_protocol.py) on Ollama's shapes: options, format, think, messages with tool calls."""

import json

import pytest
from ollama import ChatResponse, GenerateResponse

from radixlm.server.ollama_convert import OllamaStream, collect
from radixlm.server.ollama_protocol import (
    ChatRequest,
    Message,
    chat_body,
    chat_messages,
    response_format,
    sampling,
    thinking,
)
from radixlm.server.openai_protocol import RequestError, parse_request

USAGE = {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}


def chunk(delta=None, finish=None, **extra):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish, **extra}
    return {"object": "chat.completion.chunk", "choices": [choice]}


def run(conv: OllamaStream, chunks: list[dict]) -> list[dict]:
    out = []
    for c in chunks:
        out += conv.feed(c)
    return out + [conv.final()]


def test_chat_stream_text_thinking_and_done_fields():
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Hm, "}),
        chunk({"reasoning_content": "easy."}),
        chunk({"content": "Four"}),
        chunk({"content": "."}),
        chunk({}, "length"),
        {"choices": [], "usage": USAGE},
    ]
    objs = run(OllamaStream("m:latest", True, 0), chunks)
    parsed = [ChatResponse(**o) for o in objs]
    assert [p.message.thinking for p in parsed[:-1]] == ["Hm, ", "easy.", None, None]
    assert "".join(p.message.content for p in parsed) == "Four."
    assert not any(p.done for p in parsed[:-1])
    last = parsed[-1]
    assert last.done and last.done_reason == "length" and last.model == "m:latest"
    assert (last.prompt_eval_count, last.eval_count) == (30, 4)
    assert last.total_duration == last.prompt_eval_duration + last.eval_duration > 0
    whole = ChatResponse(**collect(objs))
    assert whole.message.content == "Four." and whole.message.thinking == "Hm, easy."
    assert whole.done and whole.eval_count == 4


def test_tool_call_pieces_become_one_whole_call():
    args = {"city": "Paris", "unit": "celsius"}
    text = json.dumps(args)
    pieces = [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather"}},
        {"index": 0, "function": {"arguments": text[:7]}},
        {"index": 0, "function": {"arguments": text[7:]}},
    ]
    chunks = [chunk({"tool_calls": [p]}) for p in pieces] + [chunk({}, "tool_calls")]
    objs = run(OllamaStream("m", True, 0), chunks)
    calls = [c for o in objs for c in o["message"].get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["arguments"] == args  # an object, Ollama's shape
    assert objs[-1]["done_reason"] == "stop"
    msg = ChatResponse(**collect(objs)).message
    assert msg.tool_calls[0].function.arguments == args and msg.content == ""


def test_bad_tool_arguments_are_an_internal_error():
    piece = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "[1]"}}
    conv = OllamaStream("m", True, 0)
    conv.feed(chunk({"tool_calls": [piece]}))
    with pytest.raises(RuntimeError, match="not a JSON object"):
        conv.feed(chunk({}, "tool_calls"))


def test_generate_shape_and_context_from_the_finishing_chunk():
    chunks = [
        chunk({"content": "Paris"}),
        chunk({}, "stop", token_ids=[7, 8, 2], prompt_token_ids=[1, 2, 3]),
        {"choices": [], "usage": USAGE},
    ]
    objs = run(OllamaStream("m", False, 0, context=True), chunks)
    whole = GenerateResponse(**collect(objs))
    assert whole.response == "Paris" and whole.context == [1, 2, 3, 7, 8, 2]
    assert whole.done_reason == "stop"
    # A completion stream's `text` pieces, no context asked.
    text_chunks = [
        {"choices": [{"index": 0, "text": "ab", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "c", "finish_reason": "stop"}]},
    ]
    raw = collect(run(OllamaStream("m", False, 0), text_chunks))
    assert raw["response"] == "abc" and "context" not in raw


def test_options_map_to_openai_sampling():
    req = parse_request(
        ChatRequest,
        {
            "model": "m",
            "messages": [],
            "options": {
                "temperature": 0,
                "top_k": 5,
                "repeat_penalty": 1.1,
                "num_predict": 12,
                "stop": ["\n"],
                "seed": 3,
                "mirostat": 0,
            },
        },
    )
    assert sampling(req.options) == {
        "temperature": 0,
        "top_k": 5,
        "repetition_penalty": 1.1,
        "max_tokens": 12,
        "stop": ["\n"],
        "seed": 3,
    }
    unlimited = parse_request(ChatRequest, {"model": "m", "options": {"num_predict": -1}})
    assert sampling(unlimited.options) == {}
    bad = parse_request(ChatRequest, {"model": "m", "options": {"num_predict": -3}})
    with pytest.raises(RequestError, match="options.num_predict"):
        sampling(bad.options)
    with pytest.raises(RequestError, match="options.temperature"):
        parse_request(ChatRequest, {"model": "m", "options": {"temperature": "hot"}})
    with pytest.raises(RequestError, match="options.nonsense"):
        parse_request(ChatRequest, {"model": "m", "options": {"nonsense": 1}})


def test_format_and_think():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert response_format("json") == {"type": "json_object"}
    assert response_format(schema)["json_schema"]["schema"] == schema
    assert response_format("") is None and response_format(None) is None
    with pytest.raises(RequestError, match="format"):
        parse_request(ChatRequest, {"model": "m", "format": "yaml"})
    assert thinking(True, "qwen3", "m") == {"chat_template_kwargs": {"enable_thinking": True}}
    assert thinking(False, "qwen3", "m") == {"chat_template_kwargs": {"enable_thinking": False}}
    assert thinking("max", "qwen3", "m")["reasoning_effort"] == "high"
    assert thinking(None, None, "m") == {} and thinking(False, None, "m") == {}
    with pytest.raises(RequestError, match="does not support thinking"):
        thinking(True, None, "m")


def test_messages_with_tool_calls_and_results():
    msgs = [
        Message(role="user", content="Weather in Paris?"),
        Message(
            role="assistant",
            tool_calls=[{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        ),
        Message(role="tool", content="18 C", tool_name="get_weather"),
        Message(role="user", content="Thanks", images=["aGk="]),
    ]
    out = chat_messages(msgs)
    call = out[1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert out[2] == {
        "role": "tool",
        "content": "18 C",
        "tool_call_id": call["id"],
        "name": "get_weather",
    }
    assert out[3]["content"][1]["image_url"]["url"] == "data:image;base64,aGk="
    body = chat_body(parse_request(ChatRequest, {"model": "m", "format": "json"}), out, None, "s")
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "s" and body["response_format"] == {"type": "json_object"}
    with pytest.raises(RequestError, match=r"messages.1.tool_calls.0.function.arguments"):
        chat_messages(
            [
                Message(role="user", content="x"),
                Message(role="assistant", tool_calls=[{"function": {"name": "f", "arguments": 1}}]),
            ]
        )
