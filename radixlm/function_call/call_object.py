"""One call written as a JSON object: {"name": "f", "arguments": {...}} (Hermes, Qwen, Mistral,
Llama 3 with "parameters", the JSON array of tool_choice "required"), read a character at a time.

The arguments stream as the model writes them once the name is known; they are the model's own
text of the object (not re-serialized), so the pieces streamed and the whole-text parse are the
same string. Arguments may come before the name (Hermes 2 Pro's prompt asks for
{"arguments": ..., "name": ...}); they are then sent when the name arrives.
"""

from __future__ import annotations

import json

from radixlm.function_call.block import CONT, END, FAIL
from radixlm.function_call.core_types import CallProgress, RawCall
from radixlm.function_call.json_scan import STRING, JsonScanner

NAME_KEY = "name"
ARGS_KEYS = ("arguments", "parameters")  # Llama 3's templates say "parameters"


class CallObject:
    """Reads {"name": ..., "arguments": ...}. With strict_keys, any other key means the object
    is not a call (Llama 3's bare JSON: it may be an answer in JSON); otherwise other keys (an
    "id", a "type") are read and ignored, since the section's marker already said "a call"."""

    __slots__ = (
        "js",
        "progress",
        "strict",
        "_chars",
        "_key",
        "_keys",
        "_kstart",
        "_vstart",
        "_in_args",
        "_args",
    )

    def __init__(self, strict_keys: bool = False) -> None:
        self.js = JsonScanner()
        self.progress = CallProgress()
        self.strict = strict_keys
        self._chars: list[str] = []
        self._key: str | None = None
        self._keys: set[str] = set()
        self._kstart = self._vstart = -1
        self._in_args = False
        self._args: str | None = None

    def push(self, c: str) -> int:
        """CONT, END (the object closed with c: `result()` is the call) or FAIL."""
        js = self.js
        if not js.push(c):
            return FAIL
        pos = len(self._chars)
        self._chars.append(c)
        if js.opened == 1:
            if js.state == STRING and js.is_key:
                self._kstart = pos
            elif not self._value_begins(c, pos):
                return FAIL
        if self._in_args:
            self.progress.args.append(c)
        if js.key_closed and js.depth == 1 and not self._key_ends(pos):
            return FAIL
        if js.closed == 1 and not self._value_ends(pos):
            return FAIL
        if js.done:
            return END if self.progress.name is not None else FAIL
        return CONT

    def result(self) -> RawCall:
        assert self.progress.name is not None
        return RawCall(self.progress.name, "{}" if self._args is None else self._args)

    def _key_ends(self, pos: int) -> bool:
        key = json.loads("".join(self._chars[self._kstart : pos + 1]))
        if key in self._keys or (key in ARGS_KEYS and self._keys & set(ARGS_KEYS)):
            return False  # a repeated key: which one would the model mean?
        if self.strict and key != NAME_KEY and key not in ARGS_KEYS:
            return False
        self._keys.add(key)
        self._key = key
        return True

    def _value_begins(self, c: str, pos: int) -> bool:
        self._vstart = pos
        if self._key == NAME_KEY:
            return c == '"'
        if self._key in ARGS_KEYS:
            if c not in '{"n':  # an object, a string holding one, or null
                return False
            self.progress.args_started = True
            if c == "{":
                self.progress.streamable = self._in_args = True  # push() appends c
        return True

    def _value_ends(self, pos: int) -> bool:
        span = "".join(self._chars[self._vstart : pos + 1])
        if self._key == NAME_KEY:
            name = json.loads(span)
            if not name:
                return False
            self.progress.name = name
        elif self._key in ARGS_KEYS:
            self._in_args = False
            if span[0] == "{":
                self._args = span
            elif span[0] == '"':
                self._args = _json_object_in_string(json.loads(span))
                return self._args is not None
            else:
                self._args = "{}"  # null
        return True


def _json_object_in_string(s: str) -> str | None:
    """Arguments a small model wrote as a string holding JSON: the text if it is an object."""
    try:
        value = json.loads(s, parse_constant=_reject)
    except ValueError:
        return None
    return s.strip() if isinstance(value, dict) else None


def _reject(name: str):
    raise ValueError(name)  # NaN / Infinity: not JSON a client can read back
