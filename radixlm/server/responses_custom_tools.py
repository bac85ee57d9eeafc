"""Custom (free-form) tools of the Responses API: a tool {type: "custom", name, description,
format} whose call carries one text `input` instead of JSON arguments (Codex's apply_patch is one).

The model sees a custom tool as a function with one string parameter, `input`; its call comes back
as a `custom_tool_call` output item with that string, and earlier `custom_tool_call` /
`custom_tool_call_output` input items render as the function call and its result. Grammar-
constrained formats (lark, regex) are refused naming the field: radixlm would not enforce them.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.server.openai_protocol import RequestError

INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the tool's whole input, as text"}},
    "required": ["input"],
}


def function_tool(t: dict, i: int) -> dict:
    """A custom tool as the chat function tool the template renders."""
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise RequestError(f"tools[{i}] needs a string name", f"tools.{i}.name")
    fmt = t.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise RequestError(
            f"tools[{i}].format: custom tools of format {kind!r} are not supported (a grammar"
            " would not be enforced); a free-form custom tool (format text, or none) is",
            f"tools.{i}.format",
        )
    description = t.get("description") or ""
    return {
        "type": "function",
        "function": {
            "name": t["name"],
            "description": (description + " " if description else "")
            + "(Its input is free-form text: pass all of it as `input`.)",
            "parameters": INPUT_SCHEMA,
        },
    }


def custom_names(tools: list | None) -> set[str]:
    """The names of a request's custom tools (its echoed tools)."""
    return {t["name"] for t in tools or [] if isinstance(t, dict) and t.get("type") == "custom"}


def arguments_of(text: str) -> str:
    """A custom call's input as the function call's JSON arguments."""
    return json.dumps({"input": text})


def input_of(arguments: str) -> str:
    """The function call's arguments back as the custom call's input (the raw text where the model
    wrote no `input` string)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    text = args.get("input") if isinstance(args, dict) else None
    return text if isinstance(text, str) else arguments


def custom_item(item_id: str, call_id: str, name: str, text: str) -> dict:
    """The output item (OpenAI's ResponseCustomToolCall has no status)."""
    return {
        "id": item_id,
        "type": "custom_tool_call",
        "call_id": call_id,
        "name": name,
        "input": text,
    }


def input_call(item: dict, where: str) -> dict:
    """A custom_tool_call input item as the chat tool call of an assistant message."""
    for k in ("call_id", "name", "input"):
        if not isinstance(item.get(k), str):
            raise RequestError(f"{where} (custom_tool_call) needs a string {k}", f"{where}.{k}")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": arguments_of(item["input"])},
    }


def tool_choice(choice: Any) -> dict | None:
    """{type: custom, name} as chat's function choice; None for any other value."""
    if isinstance(choice, dict) and choice.get("type") == "custom":
        if isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
    return None
