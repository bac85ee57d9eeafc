"""Tool-call parsers on the outputs each family writes (tests/parsers/cases.py): the whole-text
parse finds the calls and the content, the arguments validate against the tools' schemas, and
a stream gives exactly the same result however the output is cut: at every character, at every
UTF-8 byte (decoded as the detokenizer does), in random pieces, one character at a time; with
arguments streamed early and without."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from radixlm.function_call import TOOL_CALL_PARSERS, get_tool_call_format, parse_tool_calls
from tests.parsers.cases import CASES, SCHEMAS, TOOLS
from tests.parsers.splits import (
    byte_splits,
    every_split,
    random_splits,
    replay,
    sglang_registry_keys,
)


def _parse(case, **kw):
    return parse_tool_calls(
        get_tool_call_format(case.parser), case.text, TOOLS, rand=random.Random(0), **kw
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_whole_output_parses_to_its_calls_and_content(case):
    result = _parse(case)
    assert result.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == list(case.calls)
    assert [c.index for c in result.calls] == list(range(len(case.calls)))
    if case.arguments is not None:
        assert tuple(c.arguments for c in result.calls) == case.arguments
    assert not result.dropped and not result.broken
    for call in result.calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_stream_equals_the_whole_parse_however_the_output_is_cut(case):
    expected = _parse(case)
    fmt = get_tool_call_format(case.parser)
    cuttings = [
        *every_split(case.text),
        *byte_splits(case.text),
        *random_splits(case.text, random.Random(case.id), 20),
    ]
    for eager in (True, False):
        for pieces in cuttings:
            assert replay(fmt, pieces, TOOLS, eager=eager) == expected, (eager, pieces)


@pytest.mark.parametrize("case", [c for c in CASES if c.calls], ids=lambda c: c.id)
def test_a_call_starts_before_it_is_complete_when_streaming_arguments(case):
    """Fed a character at a time, the first call's name goes out before the output ends, and its
    arguments in more than one piece where the model wrote them as JSON after the name (they
    come whole where they precede it, are a string holding JSON, or are pythonic or XML)."""
    from radixlm.function_call import ArgsDelta, CallStart, ToolCallStream

    stream = ToolCallStream(get_tool_call_format(case.parser), TOOLS)
    seen = []
    for i, ch in enumerate(case.text):
        seen += [(i, e) for e in stream.feed(ch)]
    starts = [i for i, e in seen if isinstance(e, CallStart)]
    pieces = [e for _, e in seen if isinstance(e, ArgsDelta) and e.index == 0]
    assert starts
    if case.parser in ("pythonic", "qwen3_coder"):
        return  # the calls are known when the list (the function element) closes
    assert starts[0] < len(case.text) - 1
    whole = {"hermes-args-first", "hermes-arguments-as-string"}
    if case.parser != "pythonic" and case.id not in whole and case.calls[0][1]:
        assert len(pieces) > 1


def test_every_parser_name_is_one_of_sglangs():
    assert set(TOOL_CALL_PARSERS) <= sglang_registry_keys(
        "function_call/function_call_parser.py", "ToolCallParserEnum"
    )


@pytest.mark.parametrize("name", [*TOOL_CALL_PARSERS, "json_array"])
def test_markers_never_hide_one_another(name):
    """No marker is a prefix of another or inside one (the stream's held-back text relies on it),
    and a call id has the form the format's clients expect."""
    fmt = get_tool_call_format(name)
    markers = fmt.triggers + fmt.start_triggers
    for a in markers:
        for b in markers:
            assert a == b or (not b.startswith(a) and a not in b[1:]), (a, b)
    ids = {fmt.new_call_id(random.Random(i)) for i in range(50)}
    assert len(ids) == 50
    pattern = r"[A-Za-z0-9]{9}" if name == "mistral" else r"call_[0-9a-f]{24}"
    assert all(re.fullmatch(pattern, i) for i in ids)


def test_unknown_names_are_dropped_or_forwarded():
    """As SGLang: a call to a function not in the request's tools is left out (its name listed
    for a warning), in streaming too; forward_unknown (SGLANG_FORWARD_UNKNOWN_TOOLS) keeps it."""
    fmt = get_tool_call_format("qwen25")
    text = (
        'Hi <tool_call>{"name": "rm_rf", "arguments": {"path": "/"}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    result = parse_tool_calls(fmt, text, ["get_weather"])
    assert result.content == "Hi"
    assert [(c.index, c.name) for c in result.calls] == [(0, "get_weather")]
    assert result.dropped == ["rm_rf"]
    for pieces in every_split(text):
        for eager in (True, False):
            streamed = replay(fmt, pieces, ["get_weather"], eager=eager)
            assert (streamed.content, [c.name for c in streamed.calls]) == ("Hi", ["get_weather"])
    forwarded = parse_tool_calls(fmt, text, ["get_weather"], forward_unknown=True)
    assert [c.name for c in forwarded.calls] == ["rm_rf", "get_weather"]
    assert [
        c.name
        for c in parse_tool_calls(
            get_tool_call_format("pythonic"), "[rm(x=1), list_files()]", ["list_files"]
        ).calls
    ] == ["list_files"]


def test_tools_none_accepts_every_name():
    result = parse_tool_calls(
        get_tool_call_format("hermes"), '<tool_call>{"name": "any", "arguments": {}}</tool_call>'
    )
    assert [c.name for c in result.calls] == ["any"]
