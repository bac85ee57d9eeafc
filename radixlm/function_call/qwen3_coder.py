"""Qwen3-Coder's XML calls, which Qwen3.5 and Qwen3-Next's chat templates also write (SGLang's
`qwen3_coder` parser):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text between its tags (the template writes strings as they are and
anything else as JSON; one newline after the opening tag and before the closing one is layout).
The arguments become a JSON object: a value that reads as JSON (a number, true, an object, ...) is
that value, anything else is a string. The call is known when </function> closes it: it comes
whole, not in pieces.
"""

from __future__ import annotations

import json

from radixlm.function_call.block import CONT, END, FAIL, WS, Block, Skipper, ToolCallFormat
from radixlm.function_call.core_types import RawCall

BEGIN, END_TAG = "<tool_call>", "</tool_call>"
FUNCTION, PARAMETER = "<function=", "<parameter="
PARAMETER_END, FUNCTION_END = "</parameter>", "</function>"

_OPEN, _NAME, _PARAMS, _KEY, _VALUE, _CLOSE = range(6)


def _value(text: str):
    text = text.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(text)
    except ValueError:
        return text


class Qwen3CoderBlock(Block):
    def __init__(self) -> None:
        super().__init__()
        self.state = _OPEN
        self.glue = Skipper(FUNCTION)
        self.name = self.key = ""
        self.value: list[str] = []
        self.args: dict = {}

    def push(self, c: str) -> int:
        state = self.state
        if state == _VALUE:  # raw text up to </parameter>
            self.value.append(c)
            if c == ">" and "".join(self.value[-len(PARAMETER_END) :]) == PARAMETER_END:
                self.args[self.key] = _value("".join(self.value[: -len(PARAMETER_END)]))
                self.state, self.glue = _PARAMS, Skipper(PARAMETER, FUNCTION_END)
            return CONT
        if state in (_NAME, _KEY):  # an identifier up to ">"
            if c == ">":
                if state == _NAME:
                    self.state, self.glue = _PARAMS, Skipper(PARAMETER, FUNCTION_END)
                else:
                    self.state, self.value = _VALUE, []
                return CONT
            if c in WS or c == "<":
                return FAIL
            if state == _NAME:
                self.name += c
            else:
                self.key += c
            return CONT
        r = self.glue.push(c)
        if r != END:
            return r
        matched = self.glue.lit.matched
        if state == _OPEN:
            self.state = _NAME
        elif matched == PARAMETER:
            self.state, self.key = _KEY, ""
        elif state == _PARAMS:  # </function>
            self.calls.append(RawCall(self.name, json.dumps(self.args, ensure_ascii=False)))
            self.state, self.glue = _CLOSE, Skipper(END_TAG)
        else:  # </tool_call>
            return END
        return CONT

    def at_eof(self) -> int:
        # A call closed by </function> stands even if the output stopped before </tool_call>.
        return END if self.state == _CLOSE else FAIL


class Qwen3CoderFormat(ToolCallFormat):
    name = "qwen3_coder"
    triggers = (BEGIN,)
    section_end = END_TAG

    def open_block(self, trigger: str) -> Block:
        return Qwen3CoderBlock()
