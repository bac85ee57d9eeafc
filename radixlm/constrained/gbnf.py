"""llama.cpp's GBNF grammars as the EBNF the grammar backend reads (llama-server's `grammar`).

xgrammar's EBNF is GBNF-derived: rules, strings, character classes with \\x \\u \\U escapes, `*`
`+` `?` `{m,n}`, comments and the newline rules are the same. What differs, and what is done:

- an empty alternative (`ws ::= | " "`, `("a" |)`): GBNF allows it, xgrammar wants `""`; added;
- `.` (any character): xgrammar has no such element; written as the class of every code point;
- token matches (`<think>`, `<[1000]>`, `!<...>`): xgrammar matches text, not token ids; refused
  (GBNFError naming the line).
"""

from __future__ import annotations

import re

ANY_CHAR = r"[\x00-\U0010FFFF]"
_RULE_START = re.compile(r"[A-Za-z0-9_-]+[ \t]*::=")
_SPACE = " \t\r\n"


class GBNFError(ValueError):
    """A grammar that cannot be served: the message names the line."""


def _quoted_end(text: str, i: int, close: str) -> int:
    """The index just past the literal (string or class) that starts at text[i]."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == close:
            return j + 1
        j += 1
    raise GBNFError(f"line {text.count(chr(10), 0, i) + 1}: unterminated {text[i]}...{close}")


def gbnf_to_ebnf(text: str) -> str:
    """The grammar in xgrammar's EBNF (see the module docstring); GBNFError on what it lacks."""
    out: list[str] = []
    i, n = 0, len(text)
    expect = False  # an element (or the end of an alternative) comes next: after ::=, | and (
    mark = 0  # where in `out` that was: an empty alternative's "" goes there (same line)
    while i < n:
        c = text[i]
        if c in _SPACE:
            out.append(c)
            i += 1
            continue
        if c == "#":  # a comment, to the end of its line
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(text[i:j])
            i = j
            continue
        if expect and (c in "|)" or _RULE_START.match(text, i)):
            out.insert(mark, ' ""')  # the alternative was empty
        expect = False
        if c in '"[':
            j = _quoted_end(text, i, '"' if c == '"' else "]")
            out.append(text[i:j])
            i = j
            continue
        if c in "<!":
            line = text.count("\n", 0, i) + 1
            raise GBNFError(
                f"line {line}: token matches (<token>, <[id]>, !<...>) are not supported; "
                "write the token's text as a string"
            )
        if text.startswith("::=", i):
            out.append("::=")
            i += 3
            expect, mark = True, len(out)
            continue
        out.append(ANY_CHAR if c == "." else c)
        i += 1
        if c in "|(":
            expect, mark = True, len(out)
    if expect:
        out.insert(mark, ' ""')
    return "".join(out)


def check_gbnf(text: str) -> str:
    """The grammar translated, and parsed by xgrammar when it is installed (so that a bad grammar
    is refused before it is queued, with the parser's line and column)."""
    ebnf = gbnf_to_ebnf(text)
    try:
        import xgrammar as xgr
    except ImportError:  # another grammar backend reads it (and reports its own errors)
        return ebnf
    try:
        xgr.Grammar.from_ebnf(ebnf, root_rule_name="root")
    except Exception as e:  # xgrammar raises RuntimeError with the C++ parser's message
        last = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GBNFError(re.sub(r"^.*?grammar_parser\.cc:\d+: ", "", last)) from None
    return ebnf
