"""What the tool-call parsers return: the parsed result, the streaming events, and what a grammar
needs to force a call. Plain frozen dataclasses, no pydantic: the server maps them onto its
OpenAI objects (`ToolCall` -> `message.tool_calls[i]`, events -> `delta.tool_calls` chunks)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    """One call: OpenAI's `tool_calls[index]` with `function.name` and `function.arguments`."""

    index: int  # its position among the calls of this output (0, 1, ...)
    id: str  # "call_<24 hex>" (Mistral: 9 alphanumerics, which its chat template requires)
    name: str
    arguments: str  # a JSON object, as text: the model's own text where it wrote JSON


@dataclass
class ToolParseResult:
    """A whole output split into the content (text outside the calls) and the calls."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    # Calls the model made to functions not in the request's tools, left out (SGLang's default;
    # its SGLANG_FORWARD_UNKNOWN_TOOLS is our forward_unknown=True): their names, for a warning.
    dropped: list[str] = field(default_factory=list)
    # Streaming only: calls whose start was already sent when their text went bad (cut off by
    # max_tokens, or invalid JSON mid-arguments); their arguments are what was streamed.
    broken: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TextDelta:
    """Normal text (the `content` delta)."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A call begins: OpenAI's first `delta.tool_calls` chunk of it (index, id, name)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    """A piece of a call's arguments (the pieces of one call, joined, are its `arguments`)."""

    index: int
    text: str


ToolEvent = TextDelta | CallStart | ArgsDelta


@dataclass(frozen=True)
class StructureInfo:
    """What a structural tag (xgrammar, SGLang's spelling) needs to force one call of a function:
    generation that produces `trigger` is continued with `begin`, then JSON for the function's
    parameter schema, then `end`. `begin` starts with `trigger`."""

    begin: str
    end: str
    trigger: str


@dataclass
class CallProgress:
    """The call a block is reading now, as far as it got: the stream starts the call (CallStart)
    once `name` is known and the arguments have begun, then sends `args` as they grow."""

    name: str | None = None
    args_started: bool = False
    # The arguments are raw JSON object text the model is writing: streamable as they come.
    # (Arguments written some other way, e.g. a JSON string holding JSON, come when complete.)
    streamable: bool = False
    args: list[str] = field(default_factory=list)  # characters of the arguments so far


@dataclass(frozen=True)
class RawCall:
    """A complete call as a format read it, before the stream gives it an index and an id."""

    name: str
    arguments: str
