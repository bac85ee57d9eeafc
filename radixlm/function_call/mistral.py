"""Mistral: [TOOL_CALLS] and then the calls, in one of two spellings.

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]   (v3 tokenizer: 7B v0.3, Nemo)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                         (v11+: Small 3.2, Devstral)

[TOOL_CALLS] and [ARGS] are control tokens: the detokenizer must keep them. Mistral's chat
templates refuse a tool call id that is not 9 letters or digits, so ids here are such.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import json
import string

from radixlm.function_call.block import CONT, END, FAIL, WS, Block, Literal, ToolCallFormat
from radixlm.function_call.core_types import CallProgress, RawCall, StructureInfo
from radixlm.function_call.json_array import CallArrayBlock
from radixlm.function_call.json_scan import JsonScanner

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
_ID_CHARS = string.ascii_letters + string.digits

_START, _ARRAY, _NAME, _ARGS_TAG, _ARGS_WAIT, _ARGS = range(6)


class MistralBlock(Block):
    def __init__(self) -> None:
        super().__init__()
        self.state = _START
        self.inner: CallArrayBlock | None = None
        self.name: list[str] = []
        self.tag = Literal(ARGS)
        self.js = JsonScanner()

    def push(self, c: str) -> int:
        state = self.state
        if state == _ARRAY:
            r = self.inner.push(c)
            self.current = self.inner.current
            return r
        if state == _START:
            if c in WS:
                return CONT
            if c == "[":
                self.inner, self.state = CallArrayBlock(), _ARRAY
                self.inner.calls = self.calls  # one list: the stream takes calls from self
                return CONT
            state = self.state = _NAME
        if state == _NAME:
            if c in _NAME_CHARS:
                self.name.append(c)
                return CONT
            if c != "[" or not self.name:
                return FAIL
            self.state = _ARGS_TAG
        if self.state == _ARGS_TAG:
            r = self.tag.push(c)
            if r == END:
                self.current, self.state = CallProgress(name="".join(self.name)), _ARGS_WAIT
                return CONT
            return r
        if state == _ARGS_WAIT:
            if c in WS:
                return CONT
            if c != "{":
                return FAIL
            self.current.args_started = self.current.streamable = True
            self.state = _ARGS
        if not self.js.push(c):
            return FAIL
        self.current.args.append(c)
        if not self.js.done:
            return CONT
        self.calls.append(RawCall(self.current.name, "".join(self.current.args)))
        self.current = None
        return END  # the next call, if any, comes with its own [TOOL_CALLS]

    def at_eof(self) -> int:
        return self.inner.at_eof() if self.state == _ARRAY else FAIL


class MistralFormat(ToolCallFormat):
    name = "mistral"
    triggers = (TOOL_CALLS,)
    special_markers = (TOOL_CALLS, ARGS)

    def open_block(self, trigger: str) -> Block:
        return MistralBlock()

    def structure_info(self, name: str) -> StructureInfo:
        return StructureInfo(
            begin=f'{TOOL_CALLS} [{{"name": {json.dumps(name)}, "arguments": ',
            end="}]",
            trigger=TOOL_CALLS,
        )

    def new_call_id(self, rand) -> str:
        return "".join(rand.choice(_ID_CHARS) for _ in range(9))
