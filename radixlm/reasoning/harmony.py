"""HarmonyStream: gpt-oss's harmony output split by channel (SGLang's --reasoning-parser gpt-oss).

The prompt ends with `<|start|>assistant`, so the output starts in a message header:

    <|channel|>analysis<|message|>thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>the answer            (<|return|>: a stop token)
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"location": "Paris"}                                             (<|call|>: a stop token)

Each message goes where its header says: the analysis channel (and calls to built-in tools such
as `to=browser.search`) is reasoning; a call to `functions.NAME` (the recipient may also stand
before `<|channel|>`) is content in one normalized form, `CALL_HEADER` + arguments, which the
gpt-oss tool-call parser (function_call/harmony.py) reads; everything else (final, commentary
preambles) is content. No control token reaches the reasoning or the content. Text the model
writes outside any message (a model that does not speak harmony) is content, its control tokens
dropped; a header that never reaches `<|message|>` within _MAX_HEADER characters is such text.

The interface is ReasoningStream's (feed / finish / result, `closed`), one character at a time,
so every cutting of the output into deltas gives the same split.
"""

from __future__ import annotations

import re

from radixlm.reasoning.formats import ReasoningFormat
from radixlm.reasoning.markers import scan_char
from radixlm.reasoning.stream import ReasoningDelta, ReasoningResult

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
CONTROL_TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
FUNCTIONS = "functions."


def call_header(name: str) -> str:
    """The normalized header of a call to function `name` (what the tool-call parser reads)."""
    return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}"


_HEADER, _BODY, _BETWEEN = range(3)
_TO_REASONING, _TO_CONTENT, _TO_CALL = range(3)
_MAX_HEADER = 160  # more than a real header (channel, recipient, content type) ever holds
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


class HarmonyStream:
    def __init__(self, fmt: ReasoningFormat, forced: bool = False) -> None:
        # forced has no meaning here: the channel of each message says what it is
        self.fmt = fmt
        self.state = _HEADER
        self.opened = False  # an analysis message began: reasoning_content is not null
        self.closed = False  # an analysis message ended
        self._header: list[str] = []  # text and CHANNEL / CONSTRAIN markers, as they came
        self._route = _TO_CONTENT
        self._pending = ""  # the beginning of a possible control token, held back
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._r: list[str] = []
        self._c: list[str] = []
        self._finished = False

    def feed(self, text: str) -> ReasoningDelta:
        if self._finished:
            raise RuntimeError("feed after finish")
        was_closed = self.closed
        for ch in text:
            self._char(ch)
        return self._delta(was_closed)

    def finish(self) -> ReasoningDelta:
        if self._finished:
            return ReasoningDelta()
        was_closed = self.closed
        pending, self._pending = self._pending, ""
        for ch in pending:  # a control token cut off is text where it stands
            self._plain(ch)
        if self.state == _HEADER and not any(p in CONTROL_TOKENS for p in self._header):
            self._c.append("".join(self._header))  # plain text: not harmony at all
        self._header = []  # else a header cut off (max_tokens): nothing to show
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
    def _char(self, c: str) -> None:
        self._pending = scan_char(
            self._pending, c, lambda: CONTROL_TOKENS, self._marker, self._plain
        )

    def _plain(self, ch: str) -> None:
        if self.state == _HEADER:
            self._header.append(ch)
            if len(self._header) > _MAX_HEADER:  # no header after all: its text is content
                self._c.append("".join(p for p in self._header if p not in CONTROL_TOKENS))
                self._header, self.state = [], _BETWEEN
        elif self.state == _BODY and self._route == _TO_REASONING:
            self._r.append(ch)
        else:  # a body of content or of a call, or stray text between messages
            self._c.append(ch)

    def _marker(self, m: str) -> None:
        state = self.state
        if state == _HEADER:
            if m in (CHANNEL, CONSTRAIN):
                self._header.append(m)
            elif m == MESSAGE:
                self._open_body()
            elif m == START:
                self._header = []  # a new message; the role follows
            else:  # a message ended before its header did: nothing to show
                self._header, self.state = [], _BETWEEN
            return
        if state == _BODY:
            if m in (MESSAGE, CONSTRAIN):
                return  # out of place: dropped
            self._close_body(m)
        if m == START:
            self.state, self._header = _HEADER, []
        elif m == CHANNEL:  # a header without <|start|>assistant before it
            self.state, self._header = _HEADER, [CHANNEL]
        elif state == _BODY:
            self.state = _BETWEEN

    def _open_body(self) -> None:
        header = "".join(self._header)
        self._header, self.state = [], _BODY
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient and recipient.group(1).startswith(FUNCTIONS):
            self._route = _TO_CALL
            self._c.append(call_header(recipient.group(1)[len(FUNCTIONS) :]))
        elif recipient or (channel and channel.group(1) == "analysis"):
            self._route = _TO_REASONING  # thinking, or a call to a built-in tool
            if self.opened and (self._reasoning or self._r):
                self._r.append("\n")  # one analysis message after another
            self.opened = True
        else:
            self._route = _TO_CONTENT

    def _close_body(self, m: str) -> None:
        if self._route == _TO_REASONING:
            self.closed = True
        elif self._route == _TO_CALL:
            self._c.append(CALL)  # the call message's end, however it ended: the tool parser's

    def _delta(self, was_closed: bool) -> ReasoningDelta:
        r, c = "".join(self._r), "".join(self._c)
        self._r.clear()
        self._c.clear()
        if r:
            self._reasoning.append(r)
        if c:
            self._content.append(c)
        return ReasoningDelta(r, c, self.closed and not was_closed)
