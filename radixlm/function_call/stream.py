"""ToolCallStream: a model's output, fed in pieces, as normal text and tool calls.

The output is read one character at a time through one state machine, whatever the pieces: so
the events joined are the same for every way of cutting the text, and `parse_tool_calls` (the
whole text at once) is that same machine. What it decides:

- Normal text goes out as soon as it cannot be the start of a call marker; a possible marker's
  beginning (`<tool_` of `<tool_call>`) is held back until it is one or is not.
- A section that is not a valid call after all (invalid JSON, a cut-off call, a marker in prose)
  is normal text: its first character is text and the rest is read again (it may hold a real
  marker). Calls complete before the fault stay calls.
- A run of call sections and the whitespace around it becomes the whitespace before it, or
  nothing at the start or the end of the output ("Sure: [f(a=1)] ok" -> "Sure: ok"; the "\\n"
  around Qwen's <tool_call> blocks go). Other text is kept byte for byte, so an output without
  calls comes back unchanged.
- A call to a function not in `tools` is dropped (SGLang's default), unless forward_unknown.
- With stream_arguments (the default), a call starts (CallStart) with the delta in which its
  name is known and its arguments have begun, and its arguments go out as they are written (a
  call begun and ended within one delta goes out whole, like any complete call). A call that
  then goes bad (max_tokens cut it, invalid JSON) cannot be taken back: it stays as streamed
  and is listed in `result.broken`; only then can the stream and the whole-text parse differ
  (the parse would call it text). Without stream_arguments a call goes out whole when complete,
  and the two never differ.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

from radixlm.function_call.block import CONT, END, END_BEFORE, FAIL, WS, Block, ToolCallFormat
from radixlm.function_call.core_types import (
    ArgsDelta,
    CallProgress,
    CallStart,
    TextDelta,
    ToolCall,
    ToolEvent,
    ToolParseResult,
)

_WS_CHARS = "".join(WS)


class ToolCallStream:
    """Feed text deltas (`feed`), then `finish()`; each returns the events it produced.
    `result` is everything assembled so far (complete after finish)."""

    def __init__(
        self,
        fmt: ToolCallFormat,
        tools: Iterable[str] | None = None,
        *,
        stream_arguments: bool = True,
        forward_unknown: bool = False,
        rand: random.Random | None = None,
    ) -> None:
        self.fmt = fmt
        self._known = None if tools is None else frozenset(tools)  # None: every name is known
        self._eager = stream_arguments
        self._forward_unknown = forward_unknown
        self._rand = rand if rand is not None else random.Random()
        self._finished = False
        self._out: list[ToolEvent] = []
        self._text: list[str] = []  # normal text not yet put into a TextDelta
        self._content: list[str] = []
        self._calls: list[tuple[str, str, list[str]]] = []  # (id, name, argument pieces)
        self._dropped: list[str] = []
        self._broken: list[int] = []
        # Normal text.
        self._pending = ""  # the beginning of a possible marker, held back
        self._ws = ""  # trailing whitespace held back (see the module's docstring)
        self._after_call = False  # after a section: dropping whitespace
        self._has_text = False  # some non-whitespace content went out
        self._at_start = True  # nothing yet, not even a section: start_triggers count
        self._scan = {
            s: _trigger_scanner(fmt.triggers + (fmt.start_triggers if s else ()))
            for s in (True, False)
        }
        # The section being read.
        self._block: Block | None = None
        self._raw: list[str] = []  # its text since it began or since its last complete call
        self._block_calls = 0
        self._live: tuple[CallProgress, int, int] | None = (
            None  # started early: progress, index, sent
        )
        self._skip_to: str | None = None  # skipping a broken call's rest up to the section's end
        self._skip_seen = ""

    # ------------------------------------------------------------------ public
    def feed(self, text: str) -> list[ToolEvent]:
        if self._finished:
            raise RuntimeError("feed after finish")
        self._run(text)
        return self._drain()

    def finish(self) -> list[ToolEvent]:
        """The output ended: an open section is complete or is text; held-back text goes out."""
        if self._finished:
            return []
        while self._block is not None:
            back = self._block_eof()
            if back:
                self._run(back, live=False)  # may open another section: loop (nothing starts now)
        for ch in self._pending:  # no marker is inside another (registry test): all text
            self._text_out(ch)
        self._pending = ""
        if not self._after_call:
            self._text.append(self._ws)
        self._ws = ""
        self._finished = True
        return self._drain()

    @property
    def result(self) -> ToolParseResult:
        calls = [
            ToolCall(i, cid, name, "".join(args)) for i, (cid, name, args) in enumerate(self._calls)
        ]
        return ToolParseResult(
            "".join(self._content) + "".join(self._text),
            calls,
            list(self._dropped),
            list(self._broken),
        )

    @property
    def has_calls(self) -> bool:
        """Any call started (finish_reason "tool_calls")."""
        return bool(self._calls)

    # ------------------------------------------------------------------ the character loop
    def _run(self, s: str, live: bool = True) -> None:
        i = 0
        while i < len(s):
            if self._skip_to is not None:
                self._skip_char(s[i])
                i += 1
                continue
            if self._block is None:
                if not self._pending:
                    m = self._scan[self._at_start].search(s, i)
                    j = m.start() if m else len(s)
                    if j > i:
                        self._plain(s[i:j])
                        i = j
                        continue
                self._text_char(s[i])
                i += 1
                continue
            back = self._block_char(s[i])
            if back is None:
                i += 1
            else:  # text to read again, in place of s[i]
                s, i = back + s[i + 1 :], 0
        if live and self._block is not None:
            # once per delta: a call started and ended within it goes out whole
            self._advance_live()

    def _plain(self, chunk: str) -> None:
        """Text with no marker in it (the fast path of _text_char)."""
        if self._after_call:
            chunk = chunk.lstrip(_WS_CHARS)
            if not chunk:
                return
            self._after_call = False
        body = chunk.rstrip(_WS_CHARS)
        if body:
            self._text += (self._ws, body)
            self._ws = chunk[len(body) :]
            self._at_start, self._has_text = False, True
        else:
            self._ws += chunk

    def _text_char(self, c: str) -> None:
        if self._after_call:
            if c in WS:
                return
            self._after_call = False
        p = self._pending + c
        while p:
            triggers = self.fmt.triggers + (self.fmt.start_triggers if self._at_start else ())
            if p in triggers:
                self._pending = ""
                self._open(p)
                return
            if any(t.startswith(p) for t in triggers):
                self._pending = p
                return
            self._text_out(p[0])
            p = p[1:]
        self._pending = ""

    def _text_out(self, ch: str) -> None:
        if ch in WS:
            self._ws += ch
        else:
            self._text += (self._ws, ch)
            self._ws = ""
            self._at_start, self._has_text = False, True

    # ------------------------------------------------------------------ sections
    def _open(self, trigger: str) -> None:
        self._block = self.fmt.open_block(trigger)
        self._raw = list(trigger)
        self._block_calls = 0

    def _block_char(self, c: str) -> str | None:
        """Returns None (c consumed) or the text to read next instead of c."""
        r = self._block.push(c)
        if r == FAIL:
            return self._fail(c)
        if r != END_BEFORE:
            self._raw.append(c)
        if self._block.calls:
            self._take_calls()
        if r == CONT:
            return None
        self._close_block()
        return c if r == END_BEFORE else None

    def _block_eof(self) -> str:
        r = self._block.at_eof()
        self._take_calls()
        if r == END and self._live is None:
            self._close_block()
            return ""
        return self._fail("")

    def _fail(self, c: str) -> str:
        """The section is not valid at c (c == "": at the end of the output)."""
        self._block = None
        if self._live is not None:  # already streamed: it stays a call, a broken one
            self._broken.append(self._live[1])
            self._live = None
            self._after_call = True
            if self.fmt.section_end and c:
                self._skip_to, self._skip_seen = self.fmt.section_end, ""
            return c  # read again: skipped up to the section's end, or text
        raw = "".join(self._raw) + c
        if self._block_calls:  # the section ended after its last complete call
            self._after_call = True
            return raw
        self._text_out(raw[0])  # the marker's first character is text; the rest is read again
        return raw[1:]

    def _close_block(self) -> None:
        if self._live is not None:  # a started call its section ended without (harmony drops it)
            self._broken.append(self._live[1])
            self._live = None
        self._block = None
        self._after_call = self._block_calls > 0
        self._at_start = False

    def _skip_char(self, c: str) -> None:
        end = self._skip_to
        self._skip_seen = (self._skip_seen + c)[-len(end) :]
        if self._skip_seen == end:
            self._skip_to = None
            self._after_call = True

    # ------------------------------------------------------------------ calls
    def _allowed(self, name: str) -> bool:
        return self._known is None or name in self._known or self._forward_unknown

    def _take_calls(self) -> None:
        block = self._block
        for call in block.calls:
            self._call_seen()
            self._block_calls += 1
            if self._live is not None:
                _, index, sent = self._live
                self._live = None
                self._args_out(index, call.arguments[sent:])
            elif self._allowed(call.name):
                self._args_out(self._start_call(call.name), call.arguments)
            else:
                self._dropped.append(call.name)
            self._raw = []
        block.calls.clear()

    def _advance_live(self) -> None:
        """Start the call being read once it may be (name known, arguments begun); stream its
        arguments as they grow."""
        if not self._eager:
            return
        p = self._block.current
        if self._live is None:
            if p is None or p.name is None or not p.args_started or not self._allowed(p.name):
                return
            self._call_seen()
            self._live = (p, self._start_call(p.name), 0)
        p, index, sent = self._live
        if p.streamable and len(p.args) > sent:
            self._args_out(index, "".join(p.args[sent:]))
            self._live = (p, index, len(p.args))

    def _call_seen(self) -> None:
        if not self._has_text:
            self._ws = ""  # leading whitespace before a call goes

    def _start_call(self, name: str) -> int:
        index = len(self._calls)
        call_id = self.fmt.new_call_id(self._rand)
        self._calls.append((call_id, name, []))
        self._flush_text()
        self._out.append(CallStart(index, call_id, name))
        return index

    def _args_out(self, index: int, text: str) -> None:
        if not text:
            return
        self._calls[index][2].append(text)
        last = self._out[-1] if self._out else None
        if isinstance(last, ArgsDelta) and last.index == index:
            self._out[-1] = ArgsDelta(index, last.text + text)
        else:
            self._out.append(ArgsDelta(index, text))

    # ------------------------------------------------------------------ output
    def _flush_text(self) -> None:
        text = "".join(self._text)
        self._text.clear()
        if text:
            self._content.append(text)
            self._out.append(TextDelta(text))

    def _drain(self) -> list[ToolEvent]:
        self._flush_text()
        out, self._out = self._out, []
        return out


def _trigger_scanner(triggers: tuple[str, ...]) -> re.Pattern[str]:
    """Finds the next character that may begin a marker (plain text before it goes out at once)."""
    firsts = sorted({t[0] for t in triggers})
    return re.compile("[" + "".join(re.escape(f) for f in firsts) + "]" if firsts else r"(?!)")


def parse_tool_calls(
    fmt: ToolCallFormat,
    text: str,
    tools: Iterable[str] | None = None,
    *,
    forward_unknown: bool = False,
    rand: random.Random | None = None,
) -> ToolParseResult:
    """The whole output at once (a non-streaming response)."""
    stream = ToolCallStream(
        fmt, tools, stream_arguments=False, forward_unknown=forward_unknown, rand=rand
    )
    stream.feed(text)
    stream.finish()
    return stream.result
