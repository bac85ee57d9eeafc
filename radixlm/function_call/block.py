"""The pieces every format is built from: a Block reads the text of one tool-call section (from
its trigger, e.g. `<tool_call>`, to its end) a character at a time and says, for each character,
whether the section goes on, is over, or is not a valid section after all; `Literal` matches a
fixed marker inside a section.

The stream (stream.py) owns everything common: normal text, triggers, holding a partial trigger
back, whitespace next to calls, ids, unknown names, starting calls early. A format only describes
its syntax, so its streaming and its whole-text parse cannot disagree: they are the same code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from radixlm.function_call.core_types import CallProgress, RawCall, StructureInfo

# What one character did to a block (Block.push) or a part of one.
CONT = 0  # consumed; the section goes on
END = 1  # consumed; the section is complete with it
END_BEFORE = 2  # the section was complete before this character, which is normal text again
FAIL = 3  # this character cannot continue the section: it was not a valid section

WS = frozenset(" \t\n\r")


class Block(ABC):
    """One tool-call section being read. Completed calls go to `calls` (the stream takes them),
    the call being read is `current` (None between calls, or where a format only knows its
    calls at the end, as pythonic does)."""

    def __init__(self) -> None:
        self.calls: list[RawCall] = []
        self.current: CallProgress | None = None

    @abstractmethod
    def push(self, c: str) -> int:
        """One character of the section (after its trigger): CONT, END, END_BEFORE or FAIL."""

    @abstractmethod
    def at_eof(self) -> int:
        """The output ended inside the section: END (it is complete enough) or FAIL."""


class ToolCallFormat(ABC):
    """A model family's tool-call syntax. Subclasses set the class attributes and open blocks."""

    name: str = ""
    # Markers that open a section anywhere in the output, and ones that open it only at the very
    # start (after whitespace): Llama 3's bare JSON object, the JSON array of tool_choice
    # "required". No marker may be a proper prefix of another.
    triggers: tuple[str, ...] = ()
    start_triggers: tuple[str, ...] = ()
    # Where a section ends, for skipping the rest of a call that broke after it was streamed
    # (None: the format has no closing marker; the rest is read as normal text).
    section_end: str | None = None
    # Markers that are special tokens in the model's vocabulary: the detokenizer must keep them
    # (skip_special_tokens=False) or the parser never sees the call.
    special_markers: tuple[str, ...] = ()
    # tool_choice "required" / named force a call in this format's own syntax (forced_call_tag)
    # rather than SGLang's JSON array of calls (the default, whatever the family).
    forces_own_calls: bool = False

    @abstractmethod
    def open_block(self, trigger: str) -> Block:
        """A new section opened by `trigger` (which the block has already seen)."""

    def structure_info(self, name: str) -> StructureInfo | None:
        """begin/end/trigger of a forced call of `name` (xgrammar structural tags); None where the
        arguments are not JSON (pythonic), so no structural tag can constrain them."""
        return None

    def new_call_id(self, rand) -> str:
        """A call id (OpenAI's form); `rand` is a random.Random, so tests can fix ids."""
        return f"call_{rand.getrandbits(96):024x}"


class Literal:
    """Matches one of a few fixed strings, a character at a time (none a prefix of another)."""

    __slots__ = ("options", "seen", "matched")

    def __init__(self, *options: str) -> None:
        self.options = options
        self.seen = ""
        self.matched: str | None = None

    def push(self, c: str) -> int:
        seen = self.seen + c
        if seen in self.options:
            self.seen, self.matched = seen, seen
            return END
        if any(o.startswith(seen) for o in self.options):
            self.seen = seen
            return CONT
        return FAIL


class Skipper:
    """Whitespace, then one of `options`: the glue between the parts of a section."""

    __slots__ = ("lit",)

    def __init__(self, *options: str) -> None:
        self.lit = Literal(*options)

    def push(self, c: str) -> int:
        if not self.lit.seen and c in WS:
            return CONT
        return self.lit.push(c)
