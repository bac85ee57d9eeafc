"""gpt-oss's harmony format (--reasoning-parser / --tool-call-parser gpt-oss) on what gpt-oss
writes (OpenAI's harmony spec and gpt-oss's chat template): channels split into reasoning and
content, calls read out of the commentary channel, whole or streamed at every character and at
random cuts (control tokens split across deltas); no control token reaches reasoning or content;
the parsers detected from the template; the grammar that forces one call for tool_choice
"required" / named."""

from __future__ import annotations

import json
import random

import pytest

from radixlm.function_call import (
    detect_tool_call_parser,
    forced_call_tag,
    get_tool_call_format,
    parse_tool_calls,
)
from radixlm.reasoning import (
    detect_reasoning_parser,
    get_reasoning_format,
    parse_reasoning,
    reasoning_stream,
)
from radixlm.reasoning.harmony import CONTROL_TOKENS
from radixlm.server.chat_output import ChoiceStream, OutputSpec, shape_message
from tests.e2e.harmony_template import HARMONY_TEMPLATE
from tests.parsers.splits import every_split, random_splits

FMT = get_reasoning_format("gpt-oss")
TOOLS = get_tool_call_format("gpt-oss")
NAMES = ("get_weather", "get_stock")
CALL = (
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"location": "Paris"}'
)

# (id, output, reasoning, content as the chat message has it, calls)
CASES = [
    (
        "analysis-final",
        "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is 4.",
        "User asks 2+2. Easy.",
        "It is 4.",
        [],
    ),
    (
        "final-only",  # reasoning_effort low may skip the analysis
        "<|channel|>final<|message|>Hello!",
        None,
        "Hello!",
        [],
    ),
    (
        "analysis-call",  # <|call|> is a stop token: the output ends with the JSON
        "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant" + CALL,
        "Need the weather tool.",
        None,
        [("get_weather", {"location": "Paris"})],
    ),
    (
        "recipient-before-channel",  # the header form gpt-oss's chat template writes
        "<|channel|>analysis<|message|>Tool.<|end|><|start|>assistant to=functions.get_stock"
        '<|channel|>commentary json<|message|>{"ticker": "NVDA"}<|call|>',
        "Tool.",
        None,
        [("get_stock", {"ticker": "NVDA"})],
    ),
    (
        "preamble-then-call",  # a commentary message without recipient is for the user
        "<|channel|>commentary<|message|>Let me look that up.<|end|><|start|>assistant" + CALL,
        None,
        "Let me look that up.",
        [("get_weather", {"location": "Paris"})],
    ),
    (
        "two-analysis-and-builtin-tool",  # a built-in tool's call is the model's own business
        "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis to="
        'browser.search <|constrain|>json<|message|>{"q": "x"}<|call|><|start|>assistant'
        "<|channel|>analysis<|message|>Second.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Done.<|return|>",
        'First.\n{"q": "x"}\nSecond.',
        "Done.",
        [],
    ),
    (
        "cut-off-in-analysis",  # max_tokens while thinking
        "<|channel|>analysis<|message|>Still thinking",
        "Still thinking",
        "",
        [],
    ),
    (
        "cut-off-in-a-header",
        "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin",
        "Done.",
        "",
        [],
    ),
    ("not-harmony", "Plain words, no channels.", None, "Plain words, no channels.", []),
]


def _message(text: str) -> tuple[dict, bool]:
    spec = OutputSpec(FMT, False, TOOLS, NAMES, has_reasoning_field=True)
    return shape_message(spec, text)


def _streamed(pieces: list[str]) -> dict:
    """The chat deltas of a stream, assembled into the message's fields."""
    s = ChoiceStream(OutputSpec(FMT, False, TOOLS, NAMES, has_reasoning_field=True))
    reasoning, content, calls = [], [], {}
    for d in [d for p in pieces for d in s.feed(p)] + s.finish():
        reasoning.append(d.get("reasoning_content", ""))
        content.append(d.get("content", ""))
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], ["", ""])
            call[0] += tc.get("function", {}).get("name") or ""
            call[1] += tc["function"].get("arguments") or ""
    return {
        "reasoning": "".join(reasoning),
        "content": "".join(content),
        "calls": [(n, json.loads(a)) for n, a in (calls[i] for i in sorted(calls))],
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_channels_and_calls(case):
    _, text, reasoning, content, calls = case
    msg, has_calls = _message(text)
    got_calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in msg.get("tool_calls", [])
    ]
    assert (msg["reasoning_content"], msg["content"], got_calls) == (reasoning, content, calls)
    assert has_calls == bool(calls)
    for field in (msg["reasoning_content"], msg["content"]):
        assert not any(t in (field or "") for t in CONTROL_TOKENS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_streamed_at_every_cut_and_at_random_equals_whole(case):
    _, text, reasoning, content, calls = case
    rng = random.Random(case[0])
    expected = {"reasoning": reasoning or "", "content": content or "", "calls": calls}
    for pieces in [*every_split(text), *random_splits(text, rng, 40)]:
        assert _streamed(pieces) == expected, pieces


def test_control_tokens_cut_across_deltas_stay_out():
    """The model's special tokens arrive whole, but text may split them (a detokenizer holding
    back nothing): one character per delta."""
    text = CASES[0][1]
    stream = reasoning_stream(FMT)
    deltas = [stream.feed(c) for c in text] + [stream.finish()]
    assert "".join(d.reasoning for d in deltas) == "User asks 2+2. Easy."
    assert "".join(d.content for d in deltas) == "It is 4."
    assert [i for i, d in enumerate(deltas) if d.closed_now] == [text.index("<|end|>") + 6]


def test_random_harmony_junk_never_leaks_a_control_token():
    rng = random.Random(7)
    pieces = [*CONTROL_TOKENS, "analysis", "final", "commentary", " to=functions.get_weather"]
    pieces += [" json", "{", "}", '"a"', ":", "1", "hi ", "\n", "<|", "|>", "<|chan"]
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        r = parse_reasoning(FMT, text)
        calls = parse_tool_calls(TOOLS, r.content, NAMES)
        for field in (r.reasoning or "", calls.content if not calls.calls else ""):
            assert not any(t in field for t in CONTROL_TOKENS), (text, r, calls)
        for cut in random_splits(text, rng, 2):
            s = reasoning_stream(FMT)
            for p in cut:
                s.feed(p)
            s.finish()
            assert s.result == r, (text, cut)


def test_the_parsers_are_detected_from_a_harmony_template():
    assert detect_tool_call_parser(HARMONY_TEMPLATE) == "gpt-oss"
    assert detect_reasoning_parser(HARMONY_TEMPLATE) == "gpt-oss"
    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
    )
    assert detect_reasoning_parser(chatml) is None and detect_reasoning_parser(None) is None
    assert not FMT.thinks(None, "high")  # no think block: no require_reasoning, no budget


def _tool(name: str, params: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params}}


WEATHER = {
    "type": "object",
    "properties": {"location": {"type": "string"}},
    "required": ["location"],
    "additionalProperties": False,
}
STOCK = {"type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]}


def test_the_forced_call_grammar_takes_one_valid_call_that_parses_back():
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string as accepts

    tools = [_tool("get_weather", WEATHER), _tool("get_stock", STOCK)]
    required = xgr.Grammar.from_structural_tag(json.dumps(forced_call_tag(TOOLS, tools)))
    named = xgr.Grammar.from_structural_tag(json.dumps(forced_call_tag(TOOLS, tools[1:])))
    stock = (
        '<|channel|>commentary to=functions.get_stock <|constrain|>json<|message|>{"ticker": "X"}'
    )
    assert accepts(required, CALL) and accepts(required, stock)
    assert not accepts(required, CALL.replace("location", "town"))
    assert not accepts(required, "Sure. " + CALL)  # the call, from the first token
    assert accepts(named, stock) and not accepts(named, CALL)
    parsed = parse_tool_calls(TOOLS, parse_reasoning(FMT, stock).content, NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_stock", {"ticker": "X"})
    ]
    # the other formats force SGLang's JSON array instead
    assert forced_call_tag(get_tool_call_format("hermes"), tools) is None
