"""The stream for a reasoning format (marker pairs: ReasoningStream; gpt-oss's harmony channels:
HarmonyStream, the same interface), and a whole output split at once."""

from __future__ import annotations

from radixlm.reasoning.formats import ReasoningFormat
from radixlm.reasoning.harmony import HarmonyStream
from radixlm.reasoning.stream import ReasoningResult, ReasoningStream


def reasoning_stream(fmt: ReasoningFormat, forced: bool = False) -> ReasoningStream | HarmonyStream:
    """The stream that splits fmt's output (forced: it starts inside the think block)."""
    return HarmonyStream(fmt, forced) if fmt.harmony else ReasoningStream(fmt, forced)


def parse_reasoning(fmt: ReasoningFormat, text: str, forced: bool = False) -> ReasoningResult:
    """A whole output at once (a non-streaming response)."""
    stream = reasoning_stream(fmt, forced)
    stream.feed(text)
    stream.finish()
    return stream.result
