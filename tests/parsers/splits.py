"""Ways to cut an output into stream deltas, and the tool-call stream replayed from its events."""

from __future__ import annotations

import ast
import codecs
import importlib.util
import random
from collections.abc import Iterator
from pathlib import Path

from radixlm.function_call import (
    ArgsDelta,
    CallStart,
    TextDelta,
    ToolCall,
    ToolCallStream,
    ToolParseResult,
)


def every_split(text: str) -> Iterator[list[str]]:
    """Two pieces, cut at every character boundary (and the whole text as one piece)."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


def byte_splits(text: str) -> Iterator[list[str]]:
    """Two pieces cut at every UTF-8 byte boundary, decoded as the detokenizer does (an
    incomplete character waits for the next piece): the str deltas the parser would see."""
    data = text.encode()
    for i in range(len(data) + 1):
        dec = codecs.getincrementaldecoder("utf-8")()
        yield [dec.decode(data[:i]), dec.decode(data[i:], final=True)]


def random_splits(text: str, rng: random.Random, count: int) -> Iterator[list[str]]:
    """`count` random cuttings into 1..len pieces, single characters included."""
    for _ in range(count):
        cuts = (
            sorted(rng.sample(range(1, len(text)), rng.randint(0, max(0, min(len(text) - 1, 12)))))
            if len(text) > 1
            else []
        )
        bounds = [0, *cuts, len(text)]
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]
    yield list(text)  # one character at a time


def replay(
    fmt, pieces: list[str], tools=None, *, eager=True, seed=0, forward_unknown=False
) -> ToolParseResult:
    """Feed the pieces; rebuild the result from the events alone (checking they are well formed:
    a call starts before its arguments, indices in order, no empty delta) and check it is the
    stream's own `result`."""
    stream = ToolCallStream(
        fmt,
        tools,
        stream_arguments=eager,
        rand=random.Random(seed),
        forward_unknown=forward_unknown,
    )
    events = []
    for p in pieces:
        events += stream.feed(p)
    events += stream.finish()
    content, calls, current = [], [], -1
    for e in events:
        if isinstance(e, TextDelta):
            assert e.text
            content.append(e.text)
        elif isinstance(e, CallStart):
            assert e.index == len(calls) and e.name
            calls.append([e.id, e.name, ""])
            current = e.index
        else:
            assert isinstance(e, ArgsDelta) and e.text and e.index == current, (e, current)
            calls[e.index][2] += e.text
    rebuilt = ToolParseResult("".join(content), [ToolCall(i, *c) for i, c in enumerate(calls)])
    result = stream.result
    assert (rebuilt.content, rebuilt.calls) == (result.content, result.calls)
    return result


def sglang_registry_keys(path: str, name: str) -> set[str]:
    """The keys of a name -> class dict in the installed SGLang's source (read, not imported:
    importing its server modules needs its GPU dependencies)."""
    spec = importlib.util.find_spec("sglang")
    # The README's test command installs it: its absence is a broken set-up, not a reason to skip.
    assert spec is not None and spec.submodule_search_locations, (
        "sglang (a test dependency) is not installed"
    )
    source = Path(list(spec.submodule_search_locations)[0], "srt", path).read_text()
    for node in ast.walk(ast.parse(source)):
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == name for t in targets) and isinstance(
            node.value, ast.Dict
        ):
            return {k.value for k in node.value.keys}
    raise AssertionError(f"{name} not found in sglang/srt/{path}")
