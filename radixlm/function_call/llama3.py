"""Llama 3.1 / 3.2 / 3.3: a call is a bare JSON object, the whole reply, as their chat templates
write one back and their system prompt asks ("Respond in the format {"name": function name,
"parameters": dictionary of argument name and its value}"):

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally after <|python_tag|> (the ipython environment), several separated by ";" (SGLang's
reading). A bare object counts only at the start of the output and only with the keys name and
parameters (or arguments): a reply that is some other JSON is an answer, not a call.
Llama 3.1's built-in tools (`<|python_tag|>brave_search.call(query="...")`) are not JSON: text.
"""

from __future__ import annotations

import json

from radixlm.function_call.block import CONT, END, END_BEFORE, FAIL, WS, Block, ToolCallFormat
from radixlm.function_call.call_object import CallObject
from radixlm.function_call.core_types import StructureInfo

PYTHON_TAG = "<|python_tag|>"

_WAIT, _OBJ, _AFTER = range(3)


class Llama3Block(Block):
    def __init__(self, trigger: str) -> None:
        super().__init__()
        self.state = _WAIT
        self.obj: CallObject | None = None
        self.done = 0
        if trigger == "{":
            self._begin(trigger)

    def _begin(self, c: str) -> int:
        self.obj = CallObject(strict_keys=True)
        self.current, self.state = self.obj.progress, _OBJ
        return self.obj.push(c)

    def push(self, c: str) -> int:
        if self.state == _OBJ:
            r = self.obj.push(c)
            if r == END:
                self.calls.append(self.obj.result())
                self.done += 1
                self.current, self.state = None, _AFTER
                return CONT
            return r
        if c in WS:
            return CONT
        if self.state == _WAIT:
            return self._begin(c) if c == "{" else FAIL
        if c == ";":
            self.state = _WAIT
            return CONT
        return END_BEFORE

    def at_eof(self) -> int:
        return END if self.state == _AFTER or (self.state == _WAIT and self.done) else FAIL


class Llama3Format(ToolCallFormat):
    name = "llama3"
    triggers = (PYTHON_TAG,)
    start_triggers = ("{",)
    special_markers = (PYTHON_TAG,)

    def open_block(self, trigger: str) -> Block:
        return Llama3Block(trigger)

    def structure_info(self, name: str) -> StructureInfo:
        # SGLang's: after <|python_tag|>, which opens a section anywhere. (The bare object counts
        # only at the start of a reply, which a trigger cannot say: "required" and named
        # tool_choice force calls with the JSON array instead.)
        return StructureInfo(
            begin=f'{PYTHON_TAG}{{"name": {json.dumps(name)}, "parameters": ',
            end="}",
            trigger=PYTHON_TAG,
        )
