"""stop_match: stop_regex searched within a time budget over a bounded window, and the held-back
tail of stop strings tracked incrementally (checked against the plain definitions)."""

import random
import time

import pytest

from radixlm.stop_match import (
    STOP_REGEX_WINDOW,
    StopRegexTimeout,
    StopStringTail,
    first_match,
    hold_from,
    window,
)


def _held_by_definition(text: str, stops: list[str]) -> int:
    """The longest suffix of text that is a proper prefix of a stop string."""
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


def test_stop_string_tail_matches_the_definition_fed_in_pieces():
    rng = random.Random(0)
    for _ in range(300):
        stops = [
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 3))
        ]
        tail, text = StopStringTail(stops), ""
        for _ in range(rng.randint(1, 8)):
            piece = "".join(rng.choice("abc") for _ in range(rng.randint(1, 4)))
            text += piece
            assert tail.feed(piece) == _held_by_definition(text, stops), (stops, text)


def test_stop_string_tail_costs_the_new_text_only():
    stops = ["a" * 255 + "b"] * 16
    tail = StopStringTail(stops)
    tail.feed("a" * 10_000)
    t = time.perf_counter()
    for _ in range(100):
        tail.feed("a")
    assert tail.held == 255
    assert time.perf_counter() - t < 0.5  # 100 chunks x 16 strings x 1 character


def test_catastrophic_patterns_time_out_within_the_budget():
    t = time.perf_counter()
    with pytest.raises(StopRegexTimeout) as e:
        first_match(["never", "(x|xx)+z"], "x" * 200, budget=0.05)
    assert e.value.pattern == "(x|xx)+z"
    assert time.perf_counter() - t < 1.0
    with pytest.raises(StopRegexTimeout):
        hold_from("x" * 200 + "y", ["(x|xx)+z"], budget=0.05)


def test_window_and_matches():
    start, tail = window("a" * (STOP_REGEX_WINDOW + 10))
    assert start == 10 and len(tail) == STOP_REGEX_WINDOW
    p, m = first_match([r"\d+", "b+"], "aabbb")
    assert p == "b+" and m.start() == 2
    assert first_match([r"\d"], "abc") is None
    # Held from the earliest match that may still grow (partial) or ends at the end.
    assert hold_from("xx <ca", [r"<call>"]) == 3
    assert hold_from("xx <call> yy", [r"<call>"]) == 12
    long = "z" * (3 * STOP_REGEX_WINDOW) + "<c"
    assert hold_from(long, [r"<call>"]) == len(long) - 2
