"""What the grammar engine and start-up need from the tool-call parsers: a forced call's
structural tag (begin + JSON arguments + end must parse back to that call), the JSON schema of
tool_choice "required" / named (its outputs validate and parse back), and the parser chosen from a
chat template."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from radixlm.function_call import (
    JSON_ARRAY,
    TOOL_CALL_PARSERS,
    detect_tool_call_parser,
    get_tool_call_format,
    parse_tool_calls,
    structural_tag,
    tool_choice_schema,
)
from tests.parsers.cases import SCHEMAS
from tests.parsers.splits import every_split, replay

# What a model writes before a forced call's `begin` (DeepSeek's calls live in a section).
_SECTION = {"deepseekv3": "<｜tool▁calls▁begin｜>", "deepseekv31": "<｜tool▁calls▁begin｜>"}

# Formats whose arguments are not JSON text (Python literals; XML elements).
NOT_JSON = ("pythonic", "qwen3_coder")


@pytest.mark.parametrize("name", TOOL_CALL_PARSERS)
def test_a_forced_call_parses_back(name):
    fmt = get_tool_call_format(name)
    info = fmt.structure_info("get_weather")
    if name in NOT_JSON:
        assert info is None  # its arguments are Python or XML, not JSON: no structural tag
        return
    assert info.begin.startswith(info.trigger)
    args = json.dumps({"city": "Paris", "metric": "celsius"})
    text = _SECTION.get(name, "") + info.begin + args + info.end
    expected = parse_tool_calls(fmt, text, ["get_weather"])
    assert [(c.name, json.loads(c.arguments)) for c in expected.calls] == [
        ("get_weather", json.loads(args))
    ]
    assert expected.content == ""
    for pieces in every_split(text):
        assert (
            replay(fmt, pieces, ["get_weather"]).calls
            == parse_tool_calls(fmt, text, ["get_weather"], rand=random.Random(0)).calls
        )


def _tool(name):
    return {"type": "function", "function": {"name": name, "parameters": SCHEMAS[name]}}


def _xgrammar_accepts():
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    return xgr, _is_grammar_accept_string


@pytest.mark.parametrize("name", TOOL_CALL_PARSERS)
def test_the_structural_tag_takes_a_valid_call_only_and_the_parser_reads_it_back(name):
    """tool_choice "auto": xgrammar compiles the tag; text, then a call whose arguments fit the
    schema, is accepted and parses back to that call; arguments outside the schema are not."""
    fmt = get_tool_call_format(name)
    tools = [_tool("get_weather"), _tool("get_stock_fundamentals")]
    tag = structural_tag(fmt, tools)
    if name in NOT_JSON:
        assert tag is None
        return
    assert [s["schema"] for s in tag["structures"]] == [
        SCHEMAS["get_weather"],
        SCHEMAS["get_stock_fundamentals"],
    ]
    xgr, accepts = _xgrammar_accepts()
    grammar = xgr.Grammar.from_structural_tag(
        [
            xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
            for s in tag["structures"]
        ],
        tag["triggers"],
    )
    info = fmt.structure_info("get_weather")
    prefix = "Let me check. " + _SECTION.get(name, "")
    good = prefix + info.begin + '{"city": "Paris"}' + info.end
    assert accepts(grammar, good)
    assert not accepts(grammar, prefix + info.begin + '{"town": "Paris"}' + info.end)
    result = parse_tool_calls(fmt, good, ["get_weather", "get_stock_fundamentals"])
    assert (result.content, [(c.name, c.arguments) for c in result.calls]) == (
        "Let me check.",
        [("get_weather", '{"city": "Paris"}')],
    )


def test_the_required_schema_compiles_in_xgrammar():
    xgr, accepts = _xgrammar_accepts()
    schema = tool_choice_schema([_tool("get_weather"), _tool("list_files")], "required")
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema))
    text = (
        '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "list_files",'
        ' "parameters": {}}]'
    )
    assert accepts(grammar, text)
    assert not accepts(grammar, '[{"name": "get_weather", "parameters": {"town": "Oslo"}}]')
    assert (
        len(
            parse_tool_calls(
                get_tool_call_format(JSON_ARRAY), text, ["get_weather", "list_files"]
            ).calls
        )
        == 2
    )


def test_required_schema_accepts_the_calls_and_the_parser_reads_them():
    tools = [_tool("get_weather"), _tool("get_stock_fundamentals")]
    schema = tool_choice_schema(tools, "required")
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"name": "get_stock_fundamentals", "parameters": {"symbol": "TSLA"}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "get_weather", "parameters": {"town": "Paris"}}],
        [{"name": "nope", "parameters": {}}],
        [{"name": "get_stock_fundamentals", "parameters": {}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    result = parse_tool_calls(
        get_tool_call_format(JSON_ARRAY),
        json.dumps(good),
        ["get_weather", "get_stock_fundamentals"],
    )
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == [
        (g["name"], g["parameters"]) for g in good
    ]


def test_named_and_single_call_schemas():
    tools = [_tool("get_weather"), _tool("list_files")]
    named = tool_choice_schema(
        tools, {"type": "function", "function": {"name": "list_files"}}, parallel_tool_calls=False
    )
    assert named["items"]["properties"]["name"]["enum"] == ["list_files"] and named["maxItems"] == 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {}}], named)
    assert tool_choice_schema(tools, {"type": "function", "function": {"name": "missing"}}) is None
    assert tool_choice_schema(tools, "auto") is None and tool_choice_schema(tools, "none") is None


def test_defs_are_hoisted_to_the_root():
    """A tool's "$ref": "#/$defs/X" means the root of the schema the grammar compiles."""
    params = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/Point"}},
        "required": ["p"],
        "$defs": {
            "Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
        },
    }
    schema = tool_choice_schema(
        [{"type": "function", "function": {"name": "draw", "parameters": params}}], "required"
    )
    jsonschema.validate([{"name": "draw", "parameters": {"p": {"x": 1}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "draw", "parameters": {"p": {}}}], schema)
    other = {**params, "$defs": {"Point": {"type": "string"}}}
    with pytest.raises(ValueError, match="Point"):
        tool_choice_schema(
            [
                {"function": {"name": "a", "parameters": params}},
                {"function": {"name": "b", "parameters": other}},
            ],
            "required",
        )


# Excerpts of the published chat templates: the parts that write a past call back.
TEMPLATES = {
    "qwen25": (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- \"\\n\\n# Tools\\n\\nYou may call one or"
        ' more functions" }}{{- \'\\n<tool_call>\\n{"name": \' }}{{- tool_call.name }}{{-'
        " '\\n</tool_call>' }}"
    ),
    "hermes": (
        "You are a function calling AI model. ... within <tool_call></tool_call> XML tags as"
        ' follows:\n<tool_call>\n{"arguments": <args-dict>, "name":'
        " <function-name>}\n</tool_call><|im_end|>"
    ),
    "llama3": (
        '{{- "<|python_tag|>" + tool_call.name + ".call(" }}{{- \'{"name": "\' + tool_call.name +'
        " '\", ' }}{{- '\"parameters\": ' }}<|start_header_id|>"
    ),
    "llama3.2": (
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{{- '{\"name\": \"' +"
        " tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}"
    ),
    "pythonic": "{{- '<|header_start|>assistant<|header_end|>\\n\\n' -}}{{- '<|python_start|>' }}",
    "mistral": (
        '{%- elif message["role"] == "assistant" and message["tool_calls"] is defined %}{{-'
        ' "[TOOL_CALLS] [" }}'
    ),
    "deepseekv3": (
        "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] +"
        " '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' +"
        " tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    ),
    "deepseekv31": (
        "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] +"
        " '<｜tool▁sep｜>' + "
        "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}"
    ),
    None: (  # SmolLM2: no tools
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' +"
        " message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{"
        " '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}


@pytest.mark.parametrize("expected", list(TEMPLATES), ids=str)
def test_the_parser_is_read_from_the_chat_template(expected):
    got = detect_tool_call_parser(TEMPLATES[expected])
    assert got == (expected.split(".")[0] if expected else None)
    if got:
        get_tool_call_format(got)  # a name the registry knows


def test_templates_without_a_parsed_format():
    assert detect_tool_call_parser(None) is None and detect_tool_call_parser("") is None
    assert detect_tool_call_parser("{{ messages }}") is None


def test_qwen3_coder_xml_templates_are_read():
    """Qwen3.5's and Qwen3-Coder's templates write <function=name><parameter=...> calls."""
    qwen3_coder = "<tool_call>\n<function={{ tool_call.name }}>\n<parameter={{ args_name }}>"
    assert detect_tool_call_parser(qwen3_coder) == "qwen3_coder"


def test_unknown_parser_name_says_the_choices():
    with pytest.raises(ValueError, match="hermes"):
        get_tool_call_format("nope")
