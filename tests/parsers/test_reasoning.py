"""Reasoning parsers on what thinking models write (Qwen3's and DeepSeek-R1's chat templates and
model cards, QwQ, Kimi, Magistral, GLM-4.5): reasoning and content split right, whole or streamed
at every character / UTF-8 byte / random cut; the forced start (the prompt opened the block);
enable_thinking false; a cut-off think block; the hook that says the block closed; and the chain
the server will run (reasoning, then tool calls on the content)."""

from __future__ import annotations

import random

import pytest

from radixlm.function_call import ToolCallStream, get_tool_call_format, parse_tool_calls
from radixlm.reasoning import (
    REASONING_PARSERS,
    ReasoningResult,
    ReasoningStream,
    get_reasoning_format,
    parse_reasoning,
    reasoning_stream,
    template_opens_thinking,
)
from radixlm.reasoning.harmony import CONTROL_TOKENS
from tests.parsers.splits import byte_splits, every_split, random_splits, sglang_registry_keys

ANSWER = "The answer is 4."
CASES = [
    # (id, parser, forced, output, reasoning, content, closed)
    (
        "qwen3",
        "qwen3",
        False,
        "<think>\nThe user asks 2+2. That is 4.\n</think>\n\n" + ANSWER,
        "The user asks 2+2. That is 4.",
        ANSWER,
        True,
    ),
    (
        "qwen3-forced-writes-tag",
        "qwen3",
        True,
        "<think>\nHmm.\n</think>\n\n" + ANSWER,
        "Hmm.",
        ANSWER,
        True,
    ),
    ("qwen3-no-thinking", "qwen3", False, ANSWER, None, ANSWER, False),
    ("qwen3-empty-block", "qwen3", False, "<think>\n\n</think>\n\n" + ANSWER, "", ANSWER, True),
    ("qwen3-forced-empty", "qwen3", True, "\n</think>\n\n" + ANSWER, "", ANSWER, True),
    (
        "qwen3-think-later-is-content",
        "qwen3",
        False,
        "  Use <think> tags like <think>this</think>.",
        None,
        "  Use <think> tags like <think>this</think>.",
        False,
    ),
    (
        "r1-prompt-opened",
        "deepseek-r1",
        True,
        "Okay, so the user wants 2+2.\nIt is 4.\n</think>\n\nThe answer is **4**.",
        "Okay, so the user wants 2+2.\nIt is 4.",
        "The answer is **4**.",
        True,
    ),
    ("r1-writes-tag", "deepseek-r1", True, "<think>\nhmm\n</think>\n\n42", "hmm", "42", True),
    (
        "r1-cut-off",
        "deepseek-r1",
        True,
        "Okay, let me think about </thi",
        "Okay, let me think about </thi",
        "",
        False,
    ),
    (
        "qwq",
        "qwen3-thinking",
        True,
        "Alright, 2+2 is 4.\n</think>\n\n" + ANSWER,
        "Alright, 2+2 is 4.",
        ANSWER,
        True,
    ),
    ("kimi", "kimi", False, "◁think▷ Let me see. ◁/think▷4", "Let me see.", "4", True),
    (
        "magistral",
        "mistral",
        True,
        "[THINK]Let me compute.[/THINK]" + ANSWER,
        "Let me compute.",
        ANSWER,
        True,
    ),
    (
        "glm45-tool-ends-thinking",
        "glm45",
        False,
        "<think>I need the weather.<tool_call>get_weather\n",
        "I need the weather.",
        "<tool_call>get_weather\n",
        True,
    ),
    (
        "kimi-k2-tool-ends-thinking",
        "kimi_k2",
        True,
        "Need a tool.<|tool_calls_section_begin|><|tool_call_begin|>",
        "Need a tool.",
        "<|tool_calls_section_begin|><|tool_call_begin|>",
        True,
    ),
    ("whitespace-only", "qwen3", False, " \n ", None, " \n ", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_reasoning_and_content_split_right_however_the_output_is_cut(case):
    _, parser, forced, text, reasoning, content, closed = case
    fmt = get_reasoning_format(parser)
    expected = ReasoningResult(reasoning, content, closed)
    assert parse_reasoning(fmt, text, forced) == expected
    for pieces in [
        *every_split(text),
        *byte_splits(text),
        *random_splits(text, random.Random(case[0]), 20),
    ]:
        stream = ReasoningStream(fmt, forced)
        deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
        assert stream.result == expected, pieces
        assert "".join(d.reasoning for d in deltas) == (reasoning or "")
        assert "".join(d.content for d in deltas) == content
        assert [d.closed_now for d in deltas].count(True) == int(closed)


def test_closed_is_known_the_moment_the_end_marker_completes():
    """The hook for a thinking budget and for grammars that apply after thinking."""
    text = "<think>abc</think>\n\nanswer"
    stream = ReasoningStream(get_reasoning_format("qwen3"))
    end = text.index("</think>") + len("</think>")
    for i, ch in enumerate(text):
        delta = stream.feed(ch)
        assert stream.closed == (i >= end - 1)
        assert delta.closed_now == (i == end - 1)


def test_when_a_request_thinks():
    """SGLang's _get_reasoning_from_request, per parser."""
    qwen3, v3, r1, mistral, mimo = (
        get_reasoning_format(n) for n in ("qwen3", "deepseek-v3", "deepseek-r1", "mistral", "mimo")
    )
    assert qwen3.forced() and qwen3.forced({"enable_thinking": True}) and qwen3.forced({"other": 1})
    assert not qwen3.forced({"enable_thinking": False})
    assert not v3.forced() and v3.forced({"thinking": True}) and not v3.forced({"thinking": False})
    assert r1.forced({"enable_thinking": False})  # R1 always thinks
    assert (
        not mistral.forced()
        and not mistral.forced(reasoning_effort="none")
        and mistral.forced(reasoning_effort="high")
    )
    assert not mimo.forced() and mimo.forced({"enable_thinking": True})
    assert get_reasoning_format("kimi").thinks() and not get_reasoning_format("kimi").forced()
    assert get_reasoning_format("QWEN3") is qwen3
    with pytest.raises(ValueError, match="deepseek-r1"):
        get_reasoning_format("nope")


def test_templates_that_open_the_think_block():
    assert template_opens_thinking(
        "{%- if add_generation_prompt %}\n{{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}"
    )
    assert template_opens_thinking(
        "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
    )
    qwen3_hybrid = (
        "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is"
        " false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    )
    assert not template_opens_thinking(qwen3_hybrid)
    assert not template_opens_thinking(None)


def test_every_parser_name_is_one_of_sglangs():
    assert set(REASONING_PARSERS) <= sglang_registry_keys(
        "parser/reasoning_parser.py", "DetectorMap"
    )


@pytest.mark.parametrize("parser", REASONING_PARSERS)
def test_random_outputs(parser):
    fmt = get_reasoning_format(parser)
    rng = random.Random(parser)
    pieces = [
        fmt.start,
        fmt.end,
        fmt.start[:3],
        fmt.end[:4],
        fmt.tool_start or "x",
        " ",
        "\n",
        "a",
        "bc",
        "<",
        "[",
        "▷",
    ]
    if fmt.harmony:  # gpt-oss: every control token and channel (tests/parsers/test_harmony_parser)
        pieces += [*CONTROL_TOKENS, "analysis", "final", " to=functions.f", "commentary", "{}"]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        for forced in (False, True):
            expected = parse_reasoning(fmt, text, forced)
            if fmt.harmony:  # no control token leaks (a call's header is the tool parser's)
                leaked = [t for t in CONTROL_TOKENS if t in (expected.reasoning or "")]
                assert not leaked, (text, expected)
            elif not forced and expected.reasoning is None:
                assert expected.content == text
            for cut in random_splits(text, rng, 2):
                stream = reasoning_stream(fmt, forced)
                for p in cut:
                    stream.feed(p)
                stream.finish()
                assert stream.result == expected, (text, cut)


def test_reasoning_then_tool_calls_streamed_equals_whole():
    """The chain the chat route will run: the reasoning parser's content deltas go to the
    tool-call parser. A Qwen3 output that thinks, then calls (a "<tool_call>" inside the thinking
    is thinking, not a call)."""
    text = (
        "<think>\nI could write <tool_call> myself, but the user wants the"
        ' weather.\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments":'
        ' {"city": "Paris"}}\n</tool_call>'
    )
    rfmt, tfmt = get_reasoning_format("qwen3"), get_tool_call_format("qwen25")
    whole = parse_reasoning(rfmt, text)
    calls = parse_tool_calls(tfmt, whole.content, ["get_weather"], rand=random.Random(0))
    assert whole.reasoning == "I could write <tool_call> myself, but the user wants the weather."
    assert (calls.content, [(c.name, c.arguments) for c in calls.calls]) == (
        "Checking.",
        [("get_weather", '{"city": "Paris"}')],
    )
    for pieces in every_split(text):
        rs, ts = ReasoningStream(rfmt), ToolCallStream(tfmt, ["get_weather"], rand=random.Random(0))
        for p in pieces:
            ts.feed(rs.feed(p).content)
        ts.feed(rs.finish().content)
        ts.finish()
        assert (rs.result, ts.result) == (whole, calls)
