"""Tool-call parsers on bad output: cut off anywhere, invalid JSON, mutated, random. Never an
exception; a section that is not a valid call is normal text (the output comes back unchanged
when no call survives); the stream without early arguments always equals the whole parse, and
the early-arguments stream does too unless a call it already started went bad (then listed in
`broken`). Seeded: the same cases every run."""

from __future__ import annotations

import json
import random

import pytest

from radixlm.function_call import (
    TOOL_CALL_PARSERS,
    ToolCallStream,
    get_tool_call_format,
    parse_tool_calls,
)
from tests.parsers.cases import CASES, TOOLS
from tests.parsers.splits import random_splits, replay

ALL = [*TOOL_CALL_PARSERS, "json_array"]


def _check(fmt, text, rng, cuttings=3):
    """The properties every output has, whatever it is."""
    expected = parse_tool_calls(fmt, text, TOOLS, rand=random.Random(0))
    # nothing was a call: the text as it was (harmony drops a bad call message, function_call/
    # harmony.py: its header is control tokens)
    if not expected.calls and not expected.dropped and fmt.name != "gpt-oss":
        assert expected.content == text
    for call in expected.calls:
        assert isinstance(json.loads(call.arguments), dict)
    for pieces in random_splits(text, rng, cuttings):
        assert replay(fmt, pieces, TOOLS, eager=False) == expected, pieces
        streamed = replay(fmt, pieces, TOOLS, eager=True)
        if not streamed.broken:
            assert streamed == expected, pieces
    return expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cut_off_anywhere(case):
    """Every prefix of every case (max_tokens can stop a model at any token)."""
    fmt = get_tool_call_format(case.parser)
    rng = random.Random(case.id)
    for n in range(len(case.text) + 1):
        _check(fmt, case.text[:n], rng, cuttings=1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_mutated(case):
    """A character replaced, dropped or doubled somewhere: what small models do to JSON."""
    fmt = get_tool_call_format(case.parser)
    rng = random.Random(case.id)
    for _ in range(150):
        i = rng.randrange(len(case.text))
        op = rng.choice(["replace", "drop", "double"])
        junk = rng.choice("{}[]\",:;<>|()='\\ \nxn0")
        text = (
            case.text[:i]
            + {"replace": junk, "drop": "", "double": case.text[i] * 2}[op]
            + case.text[i + 1 :]
        )
        _check(fmt, text, rng, cuttings=2)


@pytest.mark.parametrize("name", ALL)
def test_random_text_built_from_the_formats_pieces(name):
    """Whole calls of the format, pieces of every format's outputs and of its markers, strung
    together at random: calls among junk, junk inside calls."""
    fmt = get_tool_call_format(name)
    rng = random.Random(name)
    calls = [c.text for c in CASES if c.parser == name and c.calls]
    pieces = [
        case.text[a : a + rng.randint(1, 12)] for case in CASES for a in range(0, len(case.text), 7)
    ]
    pieces += [
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|python_tag|>",
        "{",
        "}",
        "[",
        "]",
        '"',
        ";",
        ",",
        " ",
        "\n",
        "get_weather",
        '"name"',
        ":",
        '"arguments"',
        "(",
        ")",
        "x=1",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
    ]
    found = 0
    for _ in range(150):
        parts = [
            rng.choice(calls) if calls and rng.random() < 0.3 else rng.choice(pieces)
            for _ in range(rng.randint(0, 8))
        ]
        found += bool(_check(fmt, "".join(parts), rng, cuttings=2).calls)
    assert found > 15  # the property was checked on texts with calls, not only on junk


def test_invalid_json_is_text():
    fmt = get_tool_call_format("hermes")
    for text in [
        '<tool_call>{"name": "get_weather", "arguments": {"city": tru}}</tool_call>',
        # Python, not JSON
        "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Oslo'}}</tool_call>",
        # trailing comma
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo",}}</tool_call>',
        # raw newline in a string
        '<tool_call>{"name": "get_weather", "arguments": {"city": "a\nb"}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"n": NaN}}</tool_call>',
        # arguments not an object
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {}, "arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        "<tool_call></tool_call>",
        '<tool_call>{"name": "get_weather", "arguments": {}} trailing</tool_call>',
    ]:
        result = parse_tool_calls(fmt, text, TOOLS)
        if text.endswith("trailing</tool_call>"):  # the call was complete: only the rest is text
            assert ([c.name for c in result.calls], result.content) == (
                ["get_weather"],
                "trailing</tool_call>",
            )
        else:
            assert (result.calls, result.content) == ([], text), text


def test_a_marker_inside_a_bad_section_still_opens_a_call():
    """The text after a bad section's first character is read again: the model restarted."""
    fmt = get_tool_call_format("hermes")
    text = (
        '<tool_call>{"name": "get_wea<tool_call>{"name": "get_weather", "arguments": {"city":'
        ' "Oslo"}}</tool_call>'
    )
    result = parse_tool_calls(fmt, text, TOOLS)
    assert result.content == '<tool_call>{"name": "get_wea'
    assert [(c.name, c.arguments) for c in result.calls] == [("get_weather", '{"city": "Oslo"}')]


def test_a_call_cut_off_after_its_start_was_streamed_is_broken():
    """max_tokens inside the arguments: the whole parse calls it text, the early stream cannot take
    back what it sent; it ends the call as streamed and lists it in `broken` (the server may then
    report finish_reason "length" and leave the call out). Without early arguments: text."""
    fmt = get_tool_call_format("qwen25")
    text = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Os'
    assert parse_tool_calls(fmt, text, TOOLS).content == text
    stream = ToolCallStream(fmt, TOOLS)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    result = stream.result
    assert (result.content, result.broken) == ("Hi", [0])
    assert (result.calls[0].name, result.calls[0].arguments) == ("get_weather", '{"city": "Os')
    assert replay(fmt, list(text), TOOLS, eager=False).content == text


def test_a_broken_call_skips_to_its_sections_end():
    fmt = get_tool_call_format("hermes")
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": tru}}</tool_call> after'
    stream = ToolCallStream(fmt, TOOLS)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    assert (stream.result.content, stream.result.broken, stream.result.calls[0].arguments) == (
        "after",
        [0],
        '{"city": tru',
    )
    whole = ToolCallStream(
        fmt, TOOLS
    )  # in one delta, the call never started: text, as the parse says
    whole.feed(text)
    whole.finish()
    assert (whole.result.content, whole.result.calls, whole.result.broken) == (text, [], [])


def test_pythonic_is_never_evaluated():
    fmt = get_tool_call_format("pythonic")
    for text in [
        "[get_weather(city=__import__('os').system('touch /tmp/pwned'))]",
        "[get_weather(city='a' + 'b')]",
        "[get_weather('positional')]",
        "[get_weather(**{'city': 'x'})]",
        "[get_weather(city={1, 2})]",
        "[get_weather(city=1e999)]",
        "[os.system(cmd='x')]",
        "[get_weather(city=f'{x}')]",
        "[get_weather(city=" + "[" * 1000 + "]" * 1000 + ")]",
    ]:
        assert parse_tool_calls(fmt, text, TOOLS) == parse_tool_calls(fmt, text, [])
        assert parse_tool_calls(fmt, text, TOOLS).content == text


def test_long_output_costs_linear_time():
    """A long answer with no call, and a call with long arguments, fed token by token: the work
    per character stays constant (no rescanning of what was read)."""
    import time

    fmt = get_tool_call_format("qwen25")
    long_args = '{"q": "' + "x" * 20000 + '"}'
    texts = [
        "word " * 20000,
        f'<tool_call>{{"name": "search", "arguments": {long_args}}}</tool_call>',
    ]
    for text in texts:
        stream = ToolCallStream(fmt, TOOLS)
        t = time.perf_counter()
        for i in range(0, len(text), 4):
            stream.feed(text[i : i + 4])
        stream.finish()
        assert time.perf_counter() - t < 2.0
    assert stream.result.calls[0].arguments == long_args


def test_pythonic_text_is_not_held_past_a_wrong_bracket():
    """ "[f(" opens a possible call; a closer that does not match ends it there, so the answer
    after it streams at once instead of waiting for the end of the output."""
    stream = ToolCallStream(get_tool_call_format("pythonic"), TOOLS)
    assert [e.text for e in stream.feed("[f(a=1] and then the answer")] == [
        "[f(a=1] and then the answer"
    ]
