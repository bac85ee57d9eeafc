"""What the served chat template does with tools, and the stand-ins where it does nothing.

A template that renders `tools`, assistant `tool_calls` and `tool` messages (Qwen, Llama 3.1,
Mistral, ...) gets them as they are. Where it does not (SmolLM2's chatml ignores `tools` and
would drop a past call), llama.cpp's way ("generic" chat format, minja's polyfills) stands in:
the tools and the call syntax go into the system message, past calls into the assistant's
content in that syntax, tool results into user messages in <tool_response> tags. What a template
renders is found by rendering probes once per template (as minja's capability check does).

The tool-call parser for tool_choice "auto": --tool-call-parser, else the one the template's
markers name (detect_tool_call_parser), else, for a template that shows no tools at all, hermes
(the <tool_call> syntax the system message then asks for). A template that renders tools in a
syntax radixlm does not parse gets no parser: "auto" answers are plain content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from radixlm.function_call import ToolCallFormat, detect_tool_call_parser, get_tool_call_format

GENERIC_PARSER = "hermes"
_PROBE_FN, _PROBE_CALL, _PROBE_RESULT = "zq_probe_tool", "zq_probe_call", "zq_probe_result"


@dataclass(frozen=True)
class ToolSetup:
    """The server's tool handling, fixed at start-up (logged then: `describe`)."""

    parser: str | None  # the --tool-call-parser name "auto" uses (None: no parsing)
    source: str  # "flag", "detected", "generic" or "none": where `parser` came from
    renders_tools: bool  # the template shows `tools`; else the system message lists them
    renders_calls: bool  # ... assistant `tool_calls`; else their text goes into the content
    renders_results: bool  # ... `tool` messages; else they become user messages

    def describe(self) -> str:
        if self.source == "flag":
            how = f"--tool-call-parser {self.parser}"
        elif self.source == "detected":
            how = f"{self.parser} (detected from the chat template)"
        elif self.source == "generic":
            how = (
                f"{self.parser}: the chat template does not render tools, so a system message lists"
                " them and asks for <tool_call> blocks"
            )
        else:
            how = (
                "none: the chat template renders tools in a syntax radixlm does not parse;"
                " tool_choice auto answers are content (required and named still give calls)"
            )
        return f"tool-call parser: {how}"


_SETUPS: dict[tuple, ToolSetup] = {}


def tool_setup(tokenizer, flag: str | None) -> ToolSetup:
    """The setup for this tokenizer's chat template (cached per template and flag)."""
    template = getattr(tokenizer, "chat_template", None)
    key = (flag, template if isinstance(template, str) else repr(template))
    if key not in _SETUPS:
        tools, calls, results = _capabilities(tokenizer)
        detected = detect_tool_call_parser(template if isinstance(template, str) else None)
        if flag:
            parser, source = flag, "flag"
        elif detected:
            parser, source = detected, "detected"
        elif not tools:
            parser, source = GENERIC_PARSER, "generic"
        else:
            parser, source = None, "none"
        _SETUPS[key] = ToolSetup(parser, source, tools, calls, results)
    return _SETUPS[key]


def _render(tokenizer, messages: list, **kw) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kw
        )
    except Exception:  # a template that refuses a role or a field does not render it
        return ""


def _capabilities(tokenizer) -> tuple[bool, bool, bool]:
    user = {"role": "user", "content": "hi"}
    fn = {
        "name": _PROBE_FN,
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    }
    with_tools = _render(tokenizer, [user], tools=[{"type": "function", "function": fn}])
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": _PROBE_CALL, "arguments": {"a": 1}},
    }
    history = _render(
        tokenizer,
        [
            user,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": _PROBE_RESULT},
        ],
    )
    return _PROBE_FN in with_tools, _PROBE_CALL in history, _PROBE_RESULT in history


def _call_text(fmt: ToolCallFormat, name: str, arguments: dict) -> str:
    """One call in the format's own syntax (its structural tag's begin and end)."""
    info = fmt.structure_info(name)
    args = json.dumps(arguments, ensure_ascii=False)
    return (
        info.begin + args + info.end if info else json.dumps({"name": name, "arguments": arguments})
    )


def system_note(tools: list[dict], fmt: ToolCallFormat) -> str:
    """The system message's tool list and call syntax (templates that do not render tools). The
    same whatever tool_choice says, so an agent's turns share their prefix in the radix cache
    (a forced choice's grammar writes its JSON array of calls whatever the note asks)."""
    listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    example = _call_text(fmt, "<function name>", {"<argument>": "<value>"})
    return (
        f"You can call these functions:\n{listing}\nTo call a function, reply with {example} (one"
        " per call); otherwise answer normally."
    )


def stand_ins(setup: ToolSetup, messages: list[dict], tools: list | None) -> list[dict]:
    """The messages with what the template does not render written into them (module docstring),
    in the syntax of the parser tool_choice "auto" uses (hermes where there is none)."""
    fmt = get_tool_call_format(setup.parser or GENERIC_PARSER)
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls") and not setup.renders_calls:
            calls = [
                _call_text(fmt, c["function"]["name"], c["function"]["arguments"])
                for c in m["tool_calls"]
            ]
            m = {
                "role": "assistant",
                "content": "\n".join(filter(None, [m.get("content") or "", *calls])),
            }
        elif m["role"] == "tool" and not setup.renders_results:
            m = {
                "role": "user",
                "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>",
            }
        out.append(m)
    if tools and not setup.renders_tools:
        note = system_note(tools, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {
                **out[0],
                "content": f"{out[0]['content']}\n\n{note}" if out[0]["content"] else note,
            }
        else:
            out.insert(0, {"role": "system", "content": note})
    return out


def agent_setup_line(tokenizer, server_args) -> str:
    """The start-up line on tools and reasoning; a ValueError for an unknown parser name."""
    from radixlm.reasoning import get_reasoning_format

    if server_args.tool_call_parser:
        get_tool_call_format(server_args.tool_call_parser)
    line = tool_setup(tokenizer, server_args.tool_call_parser).describe()
    if server_args.reasoning_parser:
        get_reasoning_format(server_args.reasoning_parser)
        line += f"; reasoning parser: {server_args.reasoning_parser}"
    return line
