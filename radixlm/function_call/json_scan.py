"""An incremental JSON recognizer: one character at a time, no backtracking, no decoding.

The tool-call parsers stream a call's arguments as the model writes them, so they must know, at
every character, whether the text so far can still be valid JSON (a bad character is caught where
it is, not at the end), and where each value at the call object's top level begins and ends (the
"name" string, the "arguments" object). json.loads answers neither for a prefix; this does, in
O(1) per character. Values are decoded with json.loads once their span is known to be complete.

It accepts exactly RFC 8259 (what json.loads accepts with strict=True, minus NaN and Infinity):
an argument string the client will json.loads must never fail there.
"""

from __future__ import annotations

# States: what the next character may be.
VALUE, OBJ_FIRST, OBJ_KEY, COLON, AFTER, ARR_FIRST, STRING, NUMBER, LITERAL, DONE = range(10)

# Number sub-states (RFC 8259 grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?).
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP = range(8)
_NUMBER_CAN_END = frozenset({N_ZERO, N_INT, N_FRAC, N_EXP})

_WS = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_CLOSER = {"{": "}", "[": "]"}


class JsonScanner:
    """Recognizes one JSON value whose top level is an object or an array.

    After each `push`, three fields say what that character did, at which container depth
    (0: the top-level value itself; 1: directly inside the top-level container):
    `opened` a value or key began (-1: none), `closed` a value ended, `key_closed` a key ended.
    A number's end is only known at the character after it; callers that need value spans
    (the call object) accept no numbers at depth 1, so that never matters to them.
    """

    __slots__ = (
        "stack",
        "state",
        "is_key",
        "esc",
        "hex_left",
        "num",
        "lit",
        "opened",
        "closed",
        "key_closed",
    )

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.state = VALUE
        self.is_key = False
        self.esc = False
        self.hex_left = 0
        self.num = N_INT
        self.lit = ""
        self.opened = self.closed = -1
        self.key_closed = False

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def depth(self) -> int:
        return len(self.stack)

    def push(self, c: str) -> bool:
        """Consume one character; False if it cannot continue a valid JSON value (the scanner is
        then spent: the caller stops there)."""
        self.opened = self.closed = -1
        self.key_closed = False
        state = self.state
        if state == STRING:
            return self._string(c)
        if state == NUMBER:
            if self._number(c):
                return True
            if self.num not in _NUMBER_CAN_END:
                return False
            self._value_done()  # the number ended before c: c is read as what follows a value
            state = self.state
        elif state == LITERAL:
            if c != self.lit[0]:
                return False
            self.lit = self.lit[1:]
            if not self.lit:
                self._value_done()
            return True
        if c in _WS:
            return state != DONE
        if state == VALUE or state == ARR_FIRST:
            if state == ARR_FIRST and c == "]":
                return self._close(c)
            return self._value(c)
        if state == OBJ_FIRST or state == OBJ_KEY:
            if c == '"':
                self.opened = len(self.stack)
                self.state, self.is_key = STRING, True
                return True
            return state == OBJ_FIRST and c == "}" and self._close(c)
        if state == COLON:
            if c == ":":
                self.state = VALUE
                return True
            return False
        if state == AFTER:
            if c == ",":
                self.state = OBJ_KEY if self.stack[-1] == "{" else VALUE
                return True
            return self._close(c)
        return False  # DONE: nothing may follow the value

    def _value(self, c: str) -> bool:
        if not self.stack and c not in "{[":
            return False  # the top level is a container (no scalar is a call)
        self.opened = len(self.stack)
        if c in "{[":
            self.stack.append(c)
            self.state = OBJ_FIRST if c == "{" else ARR_FIRST
        elif c == '"':
            self.state, self.is_key = STRING, False
        elif c == "-" or c in _DIGITS:
            self.state = NUMBER
            self.num = N_MINUS if c == "-" else (N_ZERO if c == "0" else N_INT)
        elif c in _LITERALS:
            self.state, self.lit = LITERAL, _LITERALS[c]
        else:
            self.opened = -1
            return False
        return True

    def _close(self, c: str) -> bool:
        if not self.stack or _CLOSER[self.stack[-1]] != c:
            return False
        self.stack.pop()
        self._value_done()
        return True

    def _value_done(self) -> None:
        self.closed = len(self.stack)
        self.state = AFTER if self.stack else DONE

    def _string(self, c: str) -> bool:
        if self.hex_left:
            if c not in _HEX:
                return False
            self.hex_left -= 1
        elif self.esc:
            if c == "u":
                self.hex_left = 4
            elif c not in _ESCAPES:
                return False
            self.esc = False
        elif c == "\\":
            self.esc = True
        elif c == '"':
            if self.is_key:
                self.key_closed, self.state = True, COLON
            else:
                self._value_done()
        elif c < " ":
            return False  # a raw control character (a literal newline) is not JSON
        return True

    def _number(self, c: str) -> bool:
        """Advance the number sub-state; False if c does not continue the number."""
        n, digit = self.num, c in _DIGITS
        if n == N_MINUS:
            if not digit:
                return False
            self.num = N_ZERO if c == "0" else N_INT
        elif n in (N_ZERO, N_INT):
            if digit and n == N_INT:
                pass
            elif c == ".":
                self.num = N_DOT
            elif c in "eE":
                self.num = N_E
            else:
                return False
        elif n in (N_DOT, N_FRAC):
            if digit:
                self.num = N_FRAC
            elif n == N_FRAC and c in "eE":
                self.num = N_E
            else:
                return False
        elif n == N_E:
            if c in "+-":
                self.num = N_ESIGN
            elif digit:
                self.num = N_EXP
            else:
                return False
        else:  # N_ESIGN, N_EXP
            if not digit:
                return False
            self.num = N_EXP
        return True
