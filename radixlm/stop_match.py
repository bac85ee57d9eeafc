"""Stop conditions matched in bounded time, whatever the client sends (a leaf module).

stop_regex runs on the scheduler's thread after every token and in the detokenizer after every
chunk, for every request: a pattern that backtracks catastrophically (`(x|xx)+z` on "xxxx...")
would stop all of them. So a pattern is compiled with the `regex` module (its matcher takes a
timeout, `re`'s does not), searched only in the last STOP_REGEX_WINDOW characters of the output,
and all of one request's patterns share STOP_REGEX_BUDGET_S per check: past it, StopRegexTimeout.

Stop strings: while streaming, text that may yet become a stop string is held back.
StopStringTail tracks it with one KMP automaton per string, fed only the new text: O(new
characters) per chunk, instead of testing every prefix of every string against the text.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import regex

# The most characters of output a stop_regex match may span: a wider (or unbounded: `a.*b`)
# pattern is searched in the last this many characters only.
STOP_REGEX_WINDOW = 1024
# The time one request's stop_regex patterns may take together, per check (a legitimate pattern
# takes microseconds on the window; the slack is for a loaded machine).
STOP_REGEX_BUDGET_S = 0.1


class StopRegexTimeout(Exception):
    """A stop_regex pattern did not finish its search within the budget."""

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self.pattern = pattern


@functools.lru_cache(maxsize=1024)
def compile_stop_regex(pattern: str) -> regex.Pattern:
    """Compiled once per process and pattern (validated by SamplingParams.verify before use)."""
    return regex.compile(pattern)


def _search(pattern: str, text: str, deadline: float, partial: bool = False):
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError
        return compile_stop_regex(pattern).search(text, partial=partial, timeout=left)
    except TimeoutError:
        raise StopRegexTimeout(pattern) from None


def window(text: str) -> tuple[int, str]:
    """(start, text[start:]): the part of the output stop_regex patterns are searched in."""
    start = max(0, len(text) - STOP_REGEX_WINDOW)
    return start, text[start:]


def first_match(patterns: Sequence[str], text: str, budget: float = STOP_REGEX_BUDGET_S):
    """(pattern, match) of the first pattern that matches text (a window), or None."""
    deadline = time.monotonic() + budget
    for p in patterns:
        m = _search(p, text, deadline)
        if m is not None:
            return p, m
    return None


def hold_from(text: str, patterns: Sequence[str], budget: float = STOP_REGEX_BUDGET_S) -> int:
    """Where the text a stop_regex may still match (given more output) begins: the earliest
    partial match that reaches the end of the window (the `regex` module's partial matching)."""
    deadline = time.monotonic() + budget
    start, tail = window(text)
    hold = len(tail)
    for p in patterns:
        m = _search(p, tail, deadline, partial=True)
        if m is not None and (m.partial or m.end() == len(tail)):
            hold = min(hold, m.start())
    return start + hold


def _borders(s: str) -> list[int]:
    """KMP prefix function: for each prefix s[:i + 1], the length of its longest proper border."""
    pi = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = pi[k - 1]
        if s[i] == s[k]:
            k += 1
        pi[i] = k
    return pi


class StopStringTail:
    """The longest suffix of a growing text that is a proper prefix of one of the stop strings."""

    def __init__(self, stops: Sequence[str]):
        self.stops = list(stops)
        self._pi = [_borders(s) for s in self.stops]
        self._state = [0] * len(self.stops)  # per string: the matched prefix's length
        self.held = 0

    def feed(self, new: str) -> int:
        """Append new text; returns how many characters at the end to hold back."""
        for k, s in enumerate(self.stops):
            q, pi = self._state[k], self._pi[k]
            for ch in new:
                while q and s[q] != ch:
                    q = pi[q - 1]
                if s[q] == ch:
                    q += 1
                if q == len(s):  # a whole stop string: the scheduler stops there; keep the border
                    q = pi[q - 1]
            self._state[k] = q
        self.held = max(self._state, default=0)
        return self.held
