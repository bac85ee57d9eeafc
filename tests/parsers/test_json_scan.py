"""The incremental JSON recognizer agrees with json.loads (strict, no NaN) on every text: random
JSON, pretty and compact, and random damage to it; and accepts every prefix of valid JSON
without calling it complete before its last character. Seeded."""

from __future__ import annotations

import json
import random

from radixlm.function_call.json_scan import JsonScanner


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(
        ["obj", "arr"] if depth == 0 else ["obj", "arr", "str", "num", "lit", "str", "num"]
    )
    if kind == "obj" and depth < 4:
        return {_random_str(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if kind == "arr" and depth < 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "str":
        return _random_str(rng)
    if kind == "num":
        return rng.choice([0, -0, 7, -12, 3.25, -1e-7, 6.02e23, 10**20, rng.random()])
    return rng.choice([True, False, None])


def _random_str(rng: random.Random) -> str:
    return "".join(
        rng.choice('ab "\\/\n\t\u00e9\u4e2d\U0001f600{}[],:') for _ in range(rng.randint(0, 6))
    )


def _scanner_accepts(text: str) -> bool:
    js = JsonScanner()
    return all(js.push(c) for c in text) and js.done


def _loads_accepts(text: str) -> bool:
    try:
        value = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError:
        return False
    return (
        isinstance(value, (dict, list)) and text == text.strip()
    )  # top-level container, nothing around


def test_agrees_with_json_loads():
    rng = random.Random(0)
    alphabet = '{}[]",:\\ 0123456789-+.eEtrufalsn\nxu'
    checked = 0
    for _ in range(1500):
        value = _random_value(rng)
        text = json.dumps(value, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5)
        assert _scanner_accepts(text), text
        js = JsonScanner()
        for i, c in enumerate(text):  # every prefix is accepted, and complete only at the end
            assert js.push(c) and js.done == (i == len(text) - 1), (text, i)
        for _ in range(3):
            i = rng.randrange(len(text))
            bad = text[:i] + rng.choice(["", rng.choice(alphabet), text[i] * 2]) + text[i + 1 :]
            assert _scanner_accepts(bad) == _loads_accepts(bad), bad
            checked += 1
    assert checked == 4500


def test_hand_picked_edges():
    good = [
        "{}",
        "[]",
        '{"a": [1, -0.5e+3, 0E0, true, false, null, "\\u00e9\\n"]}',
        '[{"": {}}]',
        ' {"a" : 1 }',
    ]
    bad = [
        '{"a": 01}',
        '{"a": 1.}',
        '{"a": .5}',
        '{"a": -}',
        '{"a": 1e}',
        '{"a": NaN}',
        '{"a": tru}',
        "{'a': 1}",
        '{"a": 1,}',
        "[1,]",
        '{"a" 1}',
        '{"a": "\\x"}',
        '{"a": "\\u12g4"}',
        '{"a": "line\nbreak"}',
        '"str"',
        "7",
        '{"a": 1}}',
        '{"a": 1} x',
        '{"a": [1}',
        "{1: 2}",
    ]
    for text in good:
        assert _scanner_accepts(text), text
    for text in bad:
        assert not _scanner_accepts(text), text


def test_depth_events_mark_the_top_level_spans():
    """What the call object relies on: where a depth-1 key and value begin and end."""
    text = '{"name": "f", "arguments": {"x": [1, {"y": 2}]}, "n": null}'
    js, events = JsonScanner(), []
    for i, c in enumerate(text):
        assert js.push(c)
        if js.opened == 1:
            events.append(("open", i))
        if js.closed == 1:
            events.append(("close", i))
        if js.key_closed and js.depth == 1:
            events.append(("key", i))
    spans = [
        (a[1], b[1] + 1)
        for a, b in zip(events, events[1:])
        if a[0] == "open" and b[0] in ("close", "key")
    ]
    assert [text[s:e] for s, e in spans] == [
        '"name"',
        '"f"',
        '"arguments"',
        '{"x": [1, {"y": 2}]}',
        '"n"',
        "null",
    ]
