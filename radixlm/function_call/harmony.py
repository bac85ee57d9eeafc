"""gpt-oss's harmony tool calls (SGLang's --tool-call-parser gpt-oss): a commentary-channel
message to the recipient `functions.NAME` whose body is the JSON arguments:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris"}<|call|>

`<|call|>` is a stop token, so the output usually ends right after the JSON. The harmony
reasoning split (reasoning/harmony.py) runs first and writes every call it finds in this form
(whatever order the model put the recipient and the channel in); what sits between the name and
`<|message|>` (` <|constrain|>json`, ` json`) is glue. One call per message; a forced call
(tool_choice "required" or named) is this message, by xgrammar (constraints.forced_call_tag).

Unlike the other formats, a call message that is no valid call (arguments that are not a JSON
object, cut off by max_tokens) is dropped up to its `<|call|>` (the split ends every call message
with one), not shown as text: it was addressed to a function, and its header is control tokens.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

from radixlm.function_call.block import CONT, END, FAIL, WS, Block, ToolCallFormat
from radixlm.function_call.core_types import CallProgress, RawCall, StructureInfo
from radixlm.function_call.json_scan import JsonScanner

# Harmony's control tokens (reasoning/harmony.py spells the same; the packages are independent).
CHANNEL, MESSAGE, CONSTRAIN, CALL = "<|channel|>", "<|message|>", "<|constrain|>", "<|call|>"
TRIGGER = f"{CHANNEL}commentary to=functions."

# The function's name; the glue up to <|message|>; waiting for "{"; in the JSON; the rest of the
# message up to <|call|> (after the JSON, or instead of a bad one: dropped).
_NAME, _GLUE, _WAIT, _JSON, _REST = range(5)
_MAX_GLUE = 32  # " <|constrain|>json<|message|>" and the like


class HarmonyBlock(Block):
    def __init__(self) -> None:
        super().__init__()
        self.state = _NAME
        self.word: list[str] = []
        self.glue = ""
        self.js = JsonScanner()
        self.rest = ""

    def push(self, c: str) -> int:
        state = self.state
        if state == _NAME:
            if c not in WS and c != "<":
                self.word.append(c)
                return CONT
            if not self.word:
                return FAIL
            self.current, self.state = CallProgress(name="".join(self.word)), _GLUE
            state = _GLUE
        if state == _GLUE:
            self.glue += c
            if self.glue.endswith(MESSAGE):
                self.state = _WAIT
                return CONT
            return FAIL if len(self.glue) > _MAX_GLUE else CONT
        if state == _REST:
            self.rest = (self.rest + c)[-len(CALL) :]
            return END if self.rest == CALL else CONT
        if state == _WAIT:
            if c in WS:
                return CONT
            if c != "{":
                return self._drop(c)
            self.current.args_started = self.current.streamable = True
            self.state = _JSON
        if not self.js.push(c):
            return self._drop(c)
        self.current.args.append(c)
        if self.js.done:
            self.calls.append(RawCall(self.current.name, "".join(self.current.args)))
            self.current, self.state = None, _REST
        return CONT

    def _drop(self, c: str) -> int:
        """No valid call in this message: the rest of it goes, up to <|call|>."""
        self.current, self.state = None, _REST
        return self.push(c)

    def at_eof(self) -> int:
        # the name and glue come whole from the split; a message cut off after them is dropped
        return FAIL if self.state in (_NAME, _GLUE) else END


class HarmonyFormat(ToolCallFormat):
    name = "gpt-oss"
    triggers = (TRIGGER,)
    section_end = CALL
    special_markers = (CHANNEL, MESSAGE, CONSTRAIN, CALL)
    # tool_choice "required" / named force this format's own call, not the JSON array: a harmony
    # model's calls are messages, and the call's end (<|call|>) is a stop token.
    forces_own_calls = True

    def open_block(self, trigger: str) -> Block:
        return HarmonyBlock()

    def structure_info(self, name: str) -> StructureInfo:
        return StructureInfo(
            begin=f"{TRIGGER}{name} {CONSTRAIN}json{MESSAGE}", end=CALL, trigger=TRIGGER
        )
