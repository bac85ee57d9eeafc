"""A chat choice's text as OpenAI's message: the think block split into `reasoning_content`
(--reasoning-parser), then the tool calls read out of the rest (`tool_calls`), the remainder being
`content` (null when the answer is only calls).

The same state machines serve a whole output and a stream (reasoning/, function_call/), so the
deltas of a stream, assembled, are the message of the same output: reasoning first, then the
content goes through the tool-call stream, each event becoming one delta:
{"reasoning_content"}, {"content"}, {"tool_calls": [{index, id, type, function: {name,
arguments: ""}}]} when a call starts, then {"tool_calls": [{index, function: {arguments}}]}.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.function_call import (
    ArgsDelta,
    CallStart,
    TextDelta,
    ToolCallFormat,
    ToolCallStream,
    parse_tool_calls,
)
from radixlm.reasoning import ReasoningFormat, parse_reasoning, reasoning_stream


@dataclass(frozen=True)
class OutputSpec:
    """How one request's choices are shaped."""

    reasoning: ReasoningFormat | None = (
        None  # None: no split (no parser, or separate_reasoning false)
    )
    forced: bool = False  # the output starts inside the think block
    tools: ToolCallFormat | None = None  # None: no tool-call parsing
    names: tuple[str, ...] = ()
    single: bool = False  # parallel_tool_calls false: calls after the first are dropped
    # tool_choice required / named: the grammar makes the whole output calls, so text outside
    # complete calls is a call max_tokens cut off, not an answer: no content.
    calls_only: bool = False
    has_reasoning_field: bool = (
        False  # reasoning_content is part of the message (a reasoning parser is set)
    )

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None or self.has_reasoning_field


def _call(call_id: str, name: str, arguments: str) -> dict:
    """A tool call as OpenAI's message has it (a stream's first delta of it adds its index)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def shape_message(spec: OutputSpec, text: str) -> tuple[dict, bool]:
    """The message fields for a whole output (content, tool_calls, reasoning_content), and
    whether it made calls."""
    msg: dict = {}
    if spec.reasoning is not None:
        r = parse_reasoning(spec.reasoning, text, spec.forced)
        msg["reasoning_content"], text = r.reasoning, r.content
    elif spec.has_reasoning_field:
        msg["reasoning_content"] = None
    calls: list = []
    if spec.tools is not None:
        parsed = parse_tool_calls(spec.tools, text, spec.names)
        calls = parsed.calls[:1] if spec.single else parsed.calls
        text = parsed.content
    msg["content"] = None if spec.calls_only or (calls and not text.strip()) else text
    if calls:
        msg["tool_calls"] = [_call(c.id, c.name, c.arguments) for c in calls]
    return msg, bool(calls)


class ChoiceStream:
    """One streamed choice: feed each text delta, then finish; each returns the delta dicts."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        self.reasoning = (
            reasoning_stream(spec.reasoning, spec.forced) if spec.reasoning is not None else None
        )
        self.tools = ToolCallStream(spec.tools, spec.names) if spec.tools is not None else None
        self.has_calls = False

    def feed(self, text: str) -> list[dict]:
        return self._shape(self.reasoning.feed(text) if self.reasoning else None, text, False)

    def finish(self) -> list[dict]:
        return self._shape(self.reasoning.finish() if self.reasoning else None, "", True)

    def _shape(self, rd, text: str, last: bool) -> list[dict]:
        out = []
        if rd is not None:
            if rd.reasoning:
                out.append({"reasoning_content": rd.reasoning})
            text = rd.content
        if self.tools is None:
            return out + ([{"content": text}] if text else [])
        events = self.tools.feed(text) if text else []
        if last:
            events += self.tools.finish()
        for e in events:
            if isinstance(e, TextDelta):
                if not self.spec.calls_only:
                    out.append({"content": e.text})
            elif self.spec.single and e.index > 0:
                continue
            elif isinstance(e, CallStart):
                self.has_calls = True
                out.append({"tool_calls": [{"index": e.index, **_call(e.id, e.name, "")}]})
            elif isinstance(e, ArgsDelta):
                out.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]})
        return out
