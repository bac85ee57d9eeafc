"""Markers in text that arrives a character at a time, cut anywhere by the stream's deltas: what
the think-tag stream (stream.py) and harmony's channel stream (harmony.py) share."""

from __future__ import annotations

from collections.abc import Callable, Collection


def scan_char(
    pending: str,
    c: str,
    markers: Callable[[], Collection[str]],
    on_marker: Callable[[str], None],
    on_plain: Callable[[str], None],
) -> str:
    """c after the held-back `pending` -> the text to hold back now. A whole marker goes to
    on_marker; text that can no longer begin one goes to on_plain a character at a time (markers()
    is asked again after each: a plain character may change which markers count)."""
    p = pending + c
    while p:
        current = markers()
        if p in current:
            on_marker(p)
            return ""
        if any(m.startswith(p) for m in current):
            return p
        on_plain(p[0])
        p = p[1:]
    return ""
