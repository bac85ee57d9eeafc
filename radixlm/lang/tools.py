"""gen(..., tools=[...]): a generation that calls tools, read back as the parsed calls.

tool_choice "required" or a named function ({"type": "function", "function": {"name": ...}})
constrains the output to a JSON array of calls whose arguments follow each tool's schema (the
same grammar the OpenAI route uses, so even a small model returns valid calls); "auto" lets the
model write text and constrains a call once it opens one, in the model family's format
(`tool_call_parser`, the server's --tool-call-parser names). The program describes the tools in its
prompt itself (the grammar sees the schemas; the model sees what the program wrote).

The variable holds the calls: [{"name": str, "arguments": dict}, ...] (empty when the model
answered in text); its meta info adds "content", the text outside the calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.function_call import (
    JSON_ARRAY,
    TOOL_CALL_PARSERS,
    get_tool_call_format,
    parse_tool_calls,
    structural_tag,
    tool_choice_schema,
)

ToolChoice = str | Mapping[str, Any]


def _as_tool(t: Mapping) -> dict:
    """An OpenAI tool object; a bare function ({"name", "parameters"}) is wrapped."""
    if not isinstance(t, Mapping):
        raise ValueError(
            f"gen: tools must be OpenAI tool objects or functions, got {type(t).__name__}"
        )
    f = t.get("function", t)
    if not isinstance(f, Mapping) or not isinstance(f.get("name"), str) or not f["name"]:
        raise ValueError("gen: every tool needs a function name")
    return {"type": "function", "function": dict(f)}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple
    tool_choice: ToolChoice = "required"
    parallel_tool_calls: bool = True
    tool_call_parser: str | None = None

    @classmethod
    def make(
        cls,
        tools: Sequence[Mapping],
        tool_choice: ToolChoice,
        parallel: bool,
        parser: str | None,
    ) -> ToolRequest:
        tools = tuple(_as_tool(t) for t in tools)
        if not tools:
            raise ValueError("gen: tools is empty")
        names = [t["function"]["name"] for t in tools]
        if isinstance(tool_choice, Mapping):
            wanted = (tool_choice.get("function") or {}).get("name")
            if wanted not in names:
                raise ValueError(
                    f"gen: tool_choice names {wanted!r}, which is not among the tools {names}"
                )
        elif tool_choice not in ("required", "auto"):
            raise ValueError(
                "gen: tool_choice must be 'required', 'auto' or a named function, got"
                f" {tool_choice!r}"
            )
        if tool_choice == "auto" and parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                "gen: tool_choice 'auto' needs tool_call_parser, the model family's call format "
                f"(one of {sorted(TOOL_CALL_PARSERS)}), got {parser!r}"
            )
        return cls(tools, tool_choice, parallel, parser)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def forced(self) -> bool:
        return self.tool_choice != "auto"

    def format(self):
        return get_tool_call_format(JSON_ARRAY if self.forced else self.tool_call_parser)

    def sampling_params(self) -> dict:
        """The grammar that keeps the calls valid (server sampling_params keys)."""
        if self.forced:
            return {
                "json_schema": json.dumps(
                    tool_choice_schema(self.tools, self.tool_choice, self.parallel_tool_calls)
                )
            }
        tag = structural_tag(self.format(), self.tools)
        return {"structural_tag": json.dumps(tag)} if tag else {}

    def parse(self, text: str) -> tuple[list[dict], str]:
        """-> (calls as {"name", "arguments"}, the text outside them)."""
        r = parse_tool_calls(self.format(), text, self.names)
        calls = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in r.calls]
        if not self.parallel_tool_calls:
            calls = calls[:1]
        return calls, r.content


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:  # a call cut off by max_tokens: its text as it is
        return text
