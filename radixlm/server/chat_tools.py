"""Tools on the chat route (docs/agents.md): a request's `tools`, `tool_choice`,
`parallel_tool_calls` and tool history checked (a 400 naming the field), and what they become:

- the tools the template sees (SGLang's: none for tool_choice "none", the named one only for a
  named choice) and the history with JSON-string arguments turned into the objects templates read;
- the constraint: "required" / named force a JSON array of calls by the tools' schemas
  (tool_choice_schema, SGLang's way, read back by the json_array format), or, for a format
  that forces_own_calls (gpt-oss's harmony), one call in its own syntax; "auto" gets the
  parser's structural tag, so a call the model opens is finished by the function's schema;
- the format the output is parsed with (chat_output.py does the parsing).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from radixlm.constrained.schema_check import json_schema_error
from radixlm.function_call import (
    JSON_ARRAY,
    ToolCallFormat,
    forced_call_tag,
    get_tool_call_format,
    structural_tag,
    tool_choice_schema,
)
from radixlm.reasoning import get_reasoning_format, template_opens_thinking
from radixlm.server.api_common import HTTPError
from radixlm.server.chat_output import OutputSpec
from radixlm.server.openai_protocol import ChatCompletionRequest
from radixlm.server.tool_template import ToolSetup, stand_ins

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
_OWN_CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")


@dataclass(frozen=True)
class ToolPlan:
    choice: str  # "none", "auto", "required" or "named"
    fmt: ToolCallFormat | None  # how the output is parsed (None: not at all)
    names: tuple[str, ...]  # the functions a parsed call may name
    single: bool  # parallel_tool_calls false: one call at most
    template_tools: list[dict] | None  # what the chat template's `tools` gets
    history: dict  # message index -> its tool_calls with the arguments as objects

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")


def _bad(msg: str, param: str) -> HTTPError:
    return HTTPError(400, msg, param=param)


def _check_tools(tools: list) -> list[str]:
    names: list[str] = []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise _bad(f'{at}.type must be "function"', f"{at}.type")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{at}.function must be an object with a name", f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(
                f"{at}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}",
                f"{at}.function.name",
            )
        if name in names:
            raise _bad(
                f"{at}.function.name {name!r} is already the name of tools[{names.index(name)}]",
                f"{at}.function.name",
            )
        names.append(name)
        params = fn.get("parameters")
        if params is not None:
            why = (
                "it must be a JSON schema object"
                if not isinstance(params, dict)
                else json_schema_error(params)
            )
            if why:
                raise _bad(
                    f"{at}.function.parameters is not a usable JSON schema: {why}",
                    f"{at}.function.parameters",
                )
    return names


def _choice(req: ChatCompletionRequest, names: list[str]) -> tuple[str, str | None]:
    """(kind, the named function) of tool_choice; OpenAI's default: auto with tools, else none."""
    tc = req.tool_choice
    if tc is None:
        return ("auto" if names else "none"), None
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise _bad(
                f'tool_choice must be "none", "auto", "required" or a function, got {tc!r}',
                "tool_choice",
            )
        if tc == "required" and not names:
            raise _bad('tool_choice "required" needs tools', "tool_choice")
        return tc, None
    fn = tc.get("function") if isinstance(tc, dict) and tc.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function":'
            ' {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise _bad(
            f"tool_choice names the function {name!r}, which is not among the tools "
            f"({', '.join(names) or 'none given'})",
            "tool_choice.function.name",
        )
    return "named", name


def check_history(req: ChatCompletionRequest) -> dict[int, list[dict]]:
    """Assistant tool_calls checked, with their arguments as objects (by message index); every
    tool message must answer an earlier call's id."""
    ids: set[str] = set()
    calls: dict[int, list[dict]] = {}
    for i, m in enumerate(req.messages):
        at = f"messages[{i}]"
        if m.role == "assistant" and m.tool_calls:
            calls[i] = [
                _history_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(m.tool_calls)
            ]
            ids.update(c["id"] for c in calls[i])
        elif m.role == "tool" and m.tool_call_id not in ids:
            got = "none" if m.tool_call_id is None else repr(m.tool_call_id)
            raise _bad(
                f"{at}.tool_call_id ({got}) matches no tool call of an earlier assistant message",
                f"{at}.tool_call_id",
            )
    return calls


def _history_call(c: Any, at: str) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if (
        not isinstance(fn, dict)
        or not isinstance(fn.get("name"), str)
        or not isinstance(c.get("id"), str)
    ):
        raise _bad(f"{at} must be {{id, type: function, function: {{name, arguments}}}}", at)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise _bad(
                f"{at}.function.arguments is not valid JSON: {e}", f"{at}.function.arguments"
            ) from None
    if not isinstance(args, dict):
        raise _bad(f"{at}.function.arguments must be a JSON object", f"{at}.function.arguments")
    return {**c, "type": "function", "function": {**fn, "arguments": args}}


def plan_tools(req: ChatCompletionRequest, setup: ToolSetup) -> ToolPlan:
    """Checks the request's tool fields and sets its constraint (json_schema / structural_tag)
    and skip_special_tokens on `req`; call after response_format has set its constraint."""
    tools = req.tools or []
    history = check_history(req)
    names = _check_tools(tools)
    kind, named = _choice(req, names)
    single = req.parallel_tool_calls is False or isinstance(
        req.tool_choice, dict
    )  # a named choice: one call
    if kind == "none" or not names:
        return ToolPlan("none", None, (), single, None, history)
    own = [f for f in _OWN_CONSTRAINTS if getattr(req, f) is not None]
    fmt = get_tool_call_format(setup.parser) if setup.parser else None
    if kind != "auto":
        if own:
            raise _bad(
                f"tool_choice {kind} forces a call and cannot be combined with response_format or "
                f"{', '.join(own)}",
                "tool_choice",
            )
        chosen = [t for t in tools if t["function"]["name"] == named] if named else tools
        own_call = forced_call_tag(fmt, chosen) if fmt is not None else None
        if own_call is not None:  # harmony: one call in the model's own syntax
            req.structural_tag = json.dumps(own_call)
            single = True
        else:
            fmt = get_tool_call_format(JSON_ARRAY)
            try:  # single: maxItems 1
                req.json_schema = json.dumps(tool_choice_schema(tools, req.tool_choice, not single))
            except ValueError as e:  # two tools' schemas define the same $defs name differently
                raise _bad(str(e), "tools") from None
        _keep_markers(req, fmt)
        return ToolPlan(kind, fmt, tuple([named] if named else names), single, chosen, history)
    if fmt is not None and not own:
        tag = structural_tag(fmt, tools)
        if tag is not None:
            req.structural_tag = json.dumps(
                {"structures": tag["structures"], "triggers": tag["triggers"]}
            )
    _keep_markers(req, fmt)
    return ToolPlan("auto", fmt, tuple(names), single, tools, history)


def _keep_markers(req: ChatCompletionRequest, fmt: ToolCallFormat | None) -> None:
    """The detokenizer must keep a format's special-token markers (SGLang does the same)."""
    if fmt is not None and fmt.special_markers and req.skip_special_tokens is None:
        req.skip_special_tokens = False


def template_inputs(
    plan: ToolPlan, setup: ToolSetup, messages: list[dict]
) -> tuple[list[dict], list | None]:
    """The messages and `tools` the chat template gets (tool_template.py writes in what it cannot
    show)."""
    messages = [
        {**m, "tool_calls": plan.history[i]} if i in plan.history else m
        for i, m in enumerate(messages)
    ]
    return stand_ins(setup, messages, plan.template_tools), plan.template_tools


def output_spec(
    req: ChatCompletionRequest,
    plan: ToolPlan,
    reasoning_parser: str | None,
    template: str | None,
) -> OutputSpec:
    """How the choices are shaped: the think block split off (unless separate_reasoning is false),
    then the calls parsed."""
    rfmt = get_reasoning_format(reasoning_parser) if reasoning_parser else None
    split = rfmt if rfmt is not None and req.separate_reasoning is not False else None
    forced = split is not None and (
        split.forced(req.chat_template_kwargs, req.reasoning_effort)
        or (
            template_opens_thinking(template)
            and split.thinks(req.chat_template_kwargs, req.reasoning_effort)
        )
    )
    return OutputSpec(
        split, forced, plan.fmt, plan.names, plan.single, plan.forced, rfmt is not None
    )
