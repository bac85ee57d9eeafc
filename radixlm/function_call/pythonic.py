"""Pythonic calls: a Python list of calls with keyword arguments (Llama 3.2 / 3.3's zero-shot
prompt, Llama 4, ToolACE):

    [get_weather(city="Paris", unit="celsius"), get_time(tz="CET")]

optionally wrapped in Llama 4's <|python_start|> ... <|python_end|>. The list is parsed with `ast`
and its values read as literals by hand: nothing is ever evaluated. The arguments are JSON made
from those values, so the calls are known only when the list closes: they come whole, never in
pieces. A "[" that is not "[name(" (a citation, a Markdown link) is text at once.
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from typing import Any

from radixlm.function_call.block import (
    CONT,
    END,
    END_BEFORE,
    FAIL,
    WS,
    Block,
    Literal,
    ToolCallFormat,
)
from radixlm.function_call.core_types import RawCall

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}  # what small models write for Python's
_OPENER = {")": "(", "]": "[", "}": "{"}

_OPEN, _HEAD, _IDENT, _BODY, _TAIL = range(5)


class PythonicBlock(Block):
    def __init__(self, trigger: str) -> None:
        super().__init__()
        self.wrapped = trigger == PYTHON_START
        self.state = _OPEN if self.wrapped else _HEAD
        self.text = ["["]
        self.open = [
            "["
        ]  # brackets open outside strings (a wrong closer is not Python: text at once)
        self.quote = ""  # the quote character of the string we are in
        self.escape = False
        self.tail = Literal(PYTHON_END)

    def push(self, c: str) -> int:
        state = self.state
        if state == _BODY:
            self.text.append(c)
            return self._body(c)
        if state == _TAIL:
            if not self.tail.seen and c in WS:
                return CONT
            if not self.tail.seen and c != "<":
                return END_BEFORE
            return self.tail.push(c)
        if state == _OPEN:
            if c in WS:
                return CONT
            self.state = _HEAD
            return CONT if c == "[" else FAIL
        self.text.append(c)
        if state == _HEAD:
            if c in WS:
                return CONT
            if not (c.isalpha() or c == "_"):
                return FAIL
            self.state = _IDENT
            return CONT
        if c.isalnum() or c == "_":
            return CONT
        if c == "(":
            self.state = _BODY
            self.open.append(c)
            return CONT
        return FAIL

    def _body(self, c: str) -> int:
        if self.quote:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == self.quote:
                self.quote = ""
            return CONT
        if c in "'\"":
            self.quote = c
        elif c in "([{":
            self.open.append(c)
        elif c in ")]}":
            if _OPENER[c] != self.open.pop():
                return FAIL
            if not self.open:
                return self._close()
        return CONT

    def _close(self) -> int:
        calls = parse_call_list("".join(self.text))
        if calls is None:
            return FAIL
        self.calls.extend(calls)
        if self.wrapped:
            self.state = _TAIL
            return CONT
        return END

    def at_eof(self) -> int:
        return END if self.state == _TAIL else FAIL


def parse_call_list(text: str) -> list[RawCall] | None:
    """[f(a=1), g(b="x")] as calls with JSON arguments; None if it is anything else."""
    try:
        with (
            warnings.catch_warnings()
        ):  # "invalid escape sequence" in a model's string: not ours to report
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for node in tree.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
                return None  # a call by name, with keyword arguments only
            if any(k.arg is None for k in node.keywords):
                return None  # **kwargs
            args = {k.arg: _literal(k.value) for k in node.keywords}
            calls.append(
                RawCall(node.func.id, json.dumps(args, ensure_ascii=False, allow_nan=False))
            )
        return calls
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _literal(node: ast.AST) -> Any:
    """A JSON value from a Python literal (ast.literal_eval's subset that JSON can hold)."""
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, (str, bool, int, float))
    ):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ValueError("not finite")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("sign of a non-number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise ValueError("a key that is not a string")
            out[k.value] = _literal(v)
        return out
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError(f"not a literal: {type(node).__name__}")


class PythonicFormat(ToolCallFormat):
    name = "pythonic"
    triggers = ("[", PYTHON_START)
    special_markers = (PYTHON_START, PYTHON_END)

    def open_block(self, trigger: str) -> Block:
        return PythonicBlock(trigger)
