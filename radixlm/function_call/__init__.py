"""Tool calls in model output (SGLang's sglang/srt/function_call, smaller): a parser per model
family's syntax, the same for a whole output and for a stream of deltas.

    fmt = get_tool_call_format(server_args.tool_call_parser or detect_tool_call_parser(template))
    names = [t["function"]["name"] for t in request.tools]

    # a whole output (non-streaming response)
    r = parse_tool_calls(fmt, text, names)            # r.content, r.calls[i].{index,id,name,arguments}

    # a stream: feed each text delta, then finish()
    s = ToolCallStream(fmt, names)
    for event in s.feed(delta):                      # TextDelta | CallStart | ArgsDelta
        ...
    s.finish(); s.result                             # the same ToolParseResult, assembled

A format also says how a grammar may force one of its calls (`fmt.structure_info(name)`: the
begin / end / trigger of an xgrammar structural tag; `structural_tag(fmt, tools)` for all of a
request's tools), and which of its markers are special tokens the detokenizer must keep
(`fmt.special_markers`). tool_choice "required" and named functions use the JSON_ARRAY format
with `tool_choice_schema` instead, as SGLang does; a format that `forces_own_calls` (gpt-oss's
harmony) gets one call in its own syntax (`forced_call_tag`).
"""  # noqa: E501 (diagrams and command lines kept whole)

from radixlm.function_call.block import ToolCallFormat
from radixlm.function_call.constraints import forced_call_tag, structural_tag, tool_choice_schema
from radixlm.function_call.core_types import (
    ArgsDelta,
    CallStart,
    StructureInfo,
    TextDelta,
    ToolCall,
    ToolEvent,
    ToolParseResult,
)
from radixlm.function_call.detect import detect_tool_call_parser
from radixlm.function_call.registry import JSON_ARRAY, TOOL_CALL_PARSERS, get_tool_call_format
from radixlm.function_call.stream import ToolCallStream, parse_tool_calls

__all__ = [
    "JSON_ARRAY",
    "TOOL_CALL_PARSERS",
    "ArgsDelta",
    "CallStart",
    "StructureInfo",
    "TextDelta",
    "ToolCall",
    "ToolCallFormat",
    "ToolCallStream",
    "ToolEvent",
    "ToolParseResult",
    "detect_tool_call_parser",
    "forced_call_tag",
    "get_tool_call_format",
    "parse_tool_calls",
    "structural_tag",
    "tool_choice_schema",
]
