"""DeepSeek V3 (and R1-0528) and DeepSeek V3.1 tool calls, between full-width-bar markers:

    V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
          ```json
          {"city": "Paris"}
          ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(the chat templates of DeepSeek-V3-0324 and DeepSeek-V3.1; calls may be separated by "\\n").
A call is complete when its JSON is; the markers after it are glue, forgiven if cut off.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

from radixlm.function_call.block import CONT, END, FAIL, WS, Block, Literal, Skipper, ToolCallFormat
from radixlm.function_call.core_types import CallProgress, RawCall, StructureInfo
from radixlm.function_call.json_scan import JsonScanner

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json", "```"

# Where the block is: between calls; the type ("function", V3 only) and the name; the fence
# before the JSON (V3); waiting for "{"; in the JSON; the glue after it (fence, call end).
_BETWEEN, _TYPE, _NAME, _FENCE, _WAIT, _JSON, _GLUE = range(7)


class DeepSeekBlock(Block):
    def __init__(self, v31: bool) -> None:
        super().__init__()
        self.v31 = v31
        self.done = 0
        self.word: list[str] = []
        self.js = JsonScanner()
        self._between()

    def _between(self) -> None:
        self.state, self.lit = _BETWEEN, Skipper(CALL_BEGIN, CALLS_END)

    def push(self, c: str) -> int:
        state = self.state
        if state in (_BETWEEN, _GLUE):
            r = self.lit.push(c)
            if r != END:
                return r
            if state == _GLUE:
                if self.lit.lit.matched == CALL_END:
                    self._between()
                else:  # the fence closed; the call's end marker comes next
                    self.lit = Skipper(CALL_END)
                return CONT
            if self.lit.lit.matched == CALLS_END:
                return END if self.done else FAIL
            self.state, self.word, self.lit = (_NAME if self.v31 else _TYPE), [], Literal(SEP)
            return CONT
        if state in (_TYPE, _NAME):
            return self._word(c)
        if state == _FENCE:
            r = self.lit.push(c)
            if r == END:
                self.state = _WAIT
                return CONT
            return r
        if state == _WAIT:
            if c in WS:
                return CONT
            if c != "{":
                return FAIL
            self.current.args_started = self.current.streamable = True
            self.js, self.state = JsonScanner(), _JSON
        if not self.js.push(c):
            return FAIL
        self.current.args.append(c)
        if self.js.done:
            self.calls.append(RawCall(self.current.name, "".join(self.current.args)))
            self.done += 1
            self.current, self.state = None, _GLUE
            self.lit = Skipper(CALL_END) if self.v31 else Skipper(FENCE_CLOSE, CALL_END)
        return CONT

    def _word(self, c: str) -> int:
        """The type (up to <｜tool▁sep｜>) or the name (up to the separator, or "\\n" in V3)."""
        if self.lit.seen or (c == "<" and (self.state == _TYPE or self.v31)):
            r = self.lit.push(c)
            if r != END:
                return r
            if self.state == _TYPE:
                if "".join(self.word) != "function":
                    return FAIL
                self.state, self.word, self.lit = _NAME, [], Literal(SEP)
                return CONT
            return self._named()  # V3.1: name<｜tool▁sep｜>
        if self.state == _NAME and not self.v31 and c == "\n":
            return self._named()
        if c in WS or c in "`<":
            return FAIL
        self.word.append(c)
        return CONT

    def _named(self) -> int:
        name = "".join(self.word)
        if not name:
            return FAIL
        self.current = CallProgress(name=name)
        if self.v31:
            self.state = _WAIT
        else:
            self.state, self.lit = _FENCE, Literal(FENCE_OPEN)
        return CONT

    def at_eof(self) -> int:
        return END if self.state in (_BETWEEN, _GLUE) and self.done else FAIL


class DeepSeekFormat(ToolCallFormat):
    triggers = (CALLS_BEGIN,)
    section_end = CALLS_END
    special_markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def __init__(self, v31: bool = False) -> None:
        self.v31 = v31
        self.name = "deepseekv31" if v31 else "deepseekv3"

    def open_block(self, trigger: str) -> Block:
        return DeepSeekBlock(self.v31)

    def structure_info(self, name: str) -> StructureInfo:
        # Note: the markers are special tokens; SGLang's deepseekv3 info starts at ">" + name to
        # keep them out of the grammar's text. Check against xgrammar when wiring.
        if self.v31:
            return StructureInfo(begin=f"{CALL_BEGIN}{name}{SEP}", end=CALL_END, trigger=CALL_BEGIN)
        return StructureInfo(
            begin=f"{CALL_BEGIN}function{SEP}{name}\n{FENCE_OPEN}\n",
            end=f"\n{FENCE_CLOSE}{CALL_END}",
            trigger=CALL_BEGIN,
        )
