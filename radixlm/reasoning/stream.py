"""ReasoningStream: a reasoning model's output, fed in pieces, as reasoning and content.

One state machine reads the output a character at a time, so every way of cutting it into
deltas gives the same reasoning and content, and `parse_reasoning` (a whole output) is the same
machine. Its rules:

- Not forced: a think block counts only at the very start (after whitespace): `<think>` later in
  the answer is the answer's text. Without one, the output is content, byte for byte.
- Forced (the prompt opened the block): reasoning from the first character; a `<think>` the
  model writes anyway at the start is dropped.
- The reasoning loses its leading and trailing whitespace, the content its leading whitespace.
- No end marker (max_tokens hit while thinking): all of it is reasoning, and `closed` stays
  False. A tool-call marker of the format (`tool_start`) ends the thinking too; it is content.
- `closed` (and `closed_now` on the delta that closed it) is the hook for what waits on the end
  of thinking: a thinking budget, a grammar that applies to the answer only.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.reasoning.formats import ReasoningFormat
from radixlm.reasoning.markers import scan_char

_WS = frozenset(" \t\n\r")

# Before anything (a block may open), at the start of a forced block (an opening marker may come),
# in the reasoning, right after the end marker (whitespace goes), in the content.
_LEAD, _LEAD_FORCED, _REASON, _AFTER_END, _CONTENT = range(5)


@dataclass(frozen=True)
class ReasoningDelta:
    """What one feed (or finish) added: reasoning first, then content (one block per output)."""

    reasoning: str = ""
    content: str = ""
    closed_now: bool = False  # the think block ended within this delta


@dataclass(frozen=True)
class ReasoningResult:
    reasoning: str | None  # None: no think block (reasoning_content absent)
    content: str
    closed: bool  # the block ended (False: none, or cut off while thinking)


class ReasoningStream:
    def __init__(self, fmt: ReasoningFormat, forced: bool = False) -> None:
        self.fmt = fmt
        self.state = _LEAD_FORCED if forced else _LEAD
        self.opened = forced
        self.closed = False
        self._pending = ""  # the beginning of a possible marker, held back
        self._lead = ""  # whitespace before a possible opening marker
        self._ws = ""  # the reasoning's trailing whitespace, held back
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._r: list[str] = []  # this delta's reasoning
        self._c: list[str] = []  # this delta's content
        self._finished = False

    def feed(self, text: str) -> ReasoningDelta:
        if self._finished:
            raise RuntimeError("feed after finish")
        was_closed = self.closed
        if self.state == _CONTENT and not self._pending:
            self._c.append(text)  # the common case, once thinking is over: no scanning
        else:
            for c in text:
                self._char(c)
        return self._delta(was_closed)

    def finish(self) -> ReasoningDelta:
        """The output ended: held-back text goes where it belongs."""
        if self._finished:
            return ReasoningDelta()
        was_closed = self.closed
        pending, self._pending = self._pending, ""
        for ch in pending:  # a marker cut off: its text is text where it stands
            self._plain(ch)
        if self.state == _LEAD:
            self._c.append(self._lead)  # only whitespace: content as it was
        self._finished = True
        return self._delta(was_closed)

    @property
    def result(self) -> ReasoningResult:
        reasoning = "".join(self._reasoning) + "".join(self._r)
        return ReasoningResult(
            reasoning if self.opened else None,
            "".join(self._content) + "".join(self._c),
            self.closed,
        )

    # ------------------------------------------------------------------ the character machine
    def _markers(self) -> tuple[str, ...]:
        if self.state == _LEAD:
            return (self.fmt.start,)
        ends = (self.fmt.end, self.fmt.tool_start) if self.fmt.tool_start else (self.fmt.end,)
        if self.state == _LEAD_FORCED:
            return (self.fmt.start,) + ends  # an empty block may close at once
        return ends if self.state == _REASON else ()

    def _char(self, c: str) -> None:
        if self.state == _CONTENT:
            self._c.append(c)
            return
        if not self._pending and c in _WS:
            if self.state == _LEAD:
                self._lead += c
                return
            if self.state != _REASON:
                return  # the reasoning's or the content's leading whitespace
        self._pending = scan_char(self._pending, c, self._markers, self._marker, self._plain)

    def _marker(self, m: str) -> None:
        if m == self.fmt.start:
            self.state, self.opened, self._lead = _REASON, True, ""
            return
        self._ws = ""  # the reasoning's trailing whitespace goes
        self.closed = True
        if m == self.fmt.end:
            self.state = _AFTER_END
        else:  # a tool call: thinking is over, the marker is the content's start
            self.state = _CONTENT
            self._c.append(m)

    def _plain(self, ch: str) -> None:
        """A character that is no marker (nor the start of one) where it stands."""
        state = self.state
        if state == _LEAD:
            self.state = _CONTENT
            self._c += (self._lead, ch)
        elif state == _AFTER_END:
            if ch not in _WS:
                self.state = _CONTENT
                self._c.append(ch)
        elif state == _CONTENT:
            self._c.append(ch)
        else:  # _LEAD_FORCED or _REASON
            if state == _LEAD_FORCED:
                if ch in _WS:
                    return  # the reasoning's leading whitespace
                self.state = _REASON
            if ch in _WS:
                if self._reasoning or self._r:
                    self._ws += ch
            else:
                self._r += (self._ws, ch)
                self._ws = ""

    def _delta(self, was_closed: bool) -> ReasoningDelta:
        r, c = "".join(self._r), "".join(self._c)
        self._r.clear()
        self._c.clear()
        if r:
            self._reasoning.append(r)
        if c:
            self._content.append(c)
        return ReasoningDelta(r, c, self.closed and not was_closed)
