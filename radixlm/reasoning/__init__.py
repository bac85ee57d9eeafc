"""Reasoning in model output (SGLang's sglang/srt/parser/reasoning_parser.py, smaller): the think
block split from the answer, the same for a whole output and for a stream of deltas.

    fmt = get_reasoning_format(server_args.reasoning_parser)
    forced = fmt.forced(request.chat_template_kwargs, request.reasoning_effort) or template_opens_thinking(template)

    r = parse_reasoning(fmt, text, forced)            # r.reasoning (None: no block), r.content

    s = reasoning_stream(fmt, forced)                 # ReasoningStream, or HarmonyStream (gpt-oss)
    d = s.feed(delta)                                 # d.reasoning, d.content, d.closed_now
    ... s.finish(); s.result                          # the same ReasoningResult, assembled

The content then goes to the tool-call parser, if any. `s.closed` says the think block is over
(the hook for a thinking budget and for grammars that apply to the answer only); `fmt.end` is the
marker a budget forces to close it.
"""  # noqa: E501 (diagrams and command lines kept whole)

from radixlm.reasoning.formats import (
    REASONING_PARSERS,
    ReasoningFormat,
    detect_reasoning_parser,
    get_reasoning_format,
    template_opens_thinking,
)
from radixlm.reasoning.harmony import HarmonyStream
from radixlm.reasoning.split import parse_reasoning, reasoning_stream
from radixlm.reasoning.stream import ReasoningDelta, ReasoningResult, ReasoningStream

__all__ = [
    "REASONING_PARSERS",
    "HarmonyStream",
    "ReasoningDelta",
    "ReasoningFormat",
    "ReasoningResult",
    "ReasoningStream",
    "detect_reasoning_parser",
    "get_reasoning_format",
    "parse_reasoning",
    "reasoning_stream",
    "template_opens_thinking",
]
