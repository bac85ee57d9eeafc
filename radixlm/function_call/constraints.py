"""What a grammar needs to force tool calls (built here, compiled by radixlm/constrained later):

- tool_choice "required" or a named function: a JSON schema over the array of calls that the
  JSON_ARRAY format reads back (SGLang's get_json_schema_constraint), whatever the model family,
  except a format that `forces_own_calls` (harmony): one call in its own syntax (forced_call_tag);
- tool_choice "auto": an xgrammar structural tag in SGLang's form ({"structures": [{begin,
  schema, end}], "triggers": [...]}, what the xgrammar backend's dispatch_structural_tag takes):
  free text until the model writes a trigger, then the format's begin, arguments valid for the
  function's schema, its end. None for pythonic and qwen3_coder (their arguments are not JSON).

`tools` are OpenAI tool objects ({"type": "function", "function": {"name", "parameters"}}).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from radixlm.function_call.block import ToolCallFormat

_ANY_OBJECT = {"type": "object", "properties": {}}


def _functions(tools: Sequence[Mapping]) -> list[Mapping]:
    return [t.get("function", t) for t in tools]


def structural_tag(fmt: ToolCallFormat, tools: Sequence[Mapping]) -> dict | None:
    """The structural tag that constrains every call of `fmt` to its function's schema once the
    model starts one (tool_choice "auto"); None where the format has none."""
    structures, triggers = [], []
    for f in _functions(tools):
        info = fmt.structure_info(f["name"])
        if info is None:
            return None
        structures.append(
            {"begin": info.begin, "schema": f.get("parameters") or _ANY_OBJECT, "end": info.end}
        )
        if info.trigger not in triggers:
            triggers.append(info.trigger)
    return (
        {"type": "structural_tag", "structures": structures, "triggers": triggers}
        if structures
        else None
    )


def tool_choice_schema(
    tools: Sequence[Mapping], tool_choice: str | Mapping, parallel_tool_calls: bool = True
) -> dict | None:
    """The JSON schema that forces calls for tool_choice "required" or {"type": "function",
    "function": {"name": ...}} (None for "auto" / "none", or a name not among the tools).
    `tools` are OpenAI tool objects ({"type": "function", "function": {"name", "parameters"}})."""
    functions = _functions(tools)
    if isinstance(tool_choice, Mapping):
        wanted = tool_choice.get("function", {}).get("name")
        functions = [f for f in functions if f.get("name") == wanted]
    elif tool_choice != "required":
        return None
    if not functions:
        return None
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [f["name"]]},
                "parameters": f.get("parameters") or _ANY_OBJECT,
            },
            "required": ["name", "parameters"],
        }
        for f in functions
    ]
    schema: dict = {
        "type": "array",
        "minItems": 1,
        "items": items[0] if len(items) == 1 else {"anyOf": items},
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    # "#/$defs/X" in a tool's parameters means the root of this schema now: hoist them there.
    defs: dict = {}
    for f in functions:
        for key, sub in ((f.get("parameters") or {}).get("$defs") or {}).items():
            if defs.setdefault(key, sub) != sub:
                raise ValueError(f"tools define $defs/{key} differently")
    if defs:
        schema["$defs"] = defs
    return schema


def forced_call_tag(fmt: ToolCallFormat, tools: Sequence[Mapping]) -> dict | None:
    """For a format that forces_own_calls: xgrammar's structural tag ({"type": "structural_tag",
    "format": ...}) for exactly one call of one of `tools` (the named one's, or any for
    "required"), from its begin to the end of its JSON arguments. The format's end is left to the
    model: after the grammar only stop tokens may come, and harmony's end (<|call|>) is one."""
    if not fmt.forces_own_calls:
        return None
    calls = []
    for f in _functions(tools):
        info = fmt.structure_info(f["name"])
        if info is None:
            return None
        calls.append(
            {
                "type": "sequence",
                "elements": [
                    {"type": "const_string", "value": info.begin},
                    {
                        "type": "json_schema",
                        "json_schema": f.get("parameters") or _ANY_OBJECT,
                        # one whitespace at most between tokens (", " and ": " as json.dumps):
                        # a weak model cannot loop on whitespace (the backend's any_whitespace)
                        "max_whitespace_cnt": 1,
                    },
                ],
            }
        )
    if not calls:
        return None
    one = calls[0] if len(calls) == 1 else {"type": "or", "elements": calls}
    return {"type": "structural_tag", "format": one}
