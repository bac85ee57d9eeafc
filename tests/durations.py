"""Each test file's measured duration (tests/durations.json: seconds, a serial run on a 2-core
machine) and the order it gives the run: the longest files first. pytest-xdist's `--dist loadfile`
hands files to workers in collection order, so a long file collected last keeps one worker busy
while the others idle; started first, it overlaps the many short ones.

Regenerate after a serial run with a JUnit report:
    python -m pytest -q -n 0 --junitxml=/tmp/run.xml
    python -m tests.durations /tmp/run.xml > tests/durations.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("durations.json")


def load(path: Path = TABLE) -> dict[str, float]:
    """{file path relative to the repository: seconds}; empty if the table is missing."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def order_longest_first(items: list, durations: dict[str, float]) -> None:
    """Sort pytest items in place by their file's duration, longest first. Stable: a file's tests
    keep their order (module fixtures stay shared), files of equal (or unknown: 0) duration keep
    theirs."""
    items.sort(key=lambda item: -durations.get(item.nodeid.split("::", 1)[0], 0.0))


def from_junit(xml_path: str) -> dict[str, float]:
    """Per-file seconds from a JUnit XML report (each testcase's time holds its setup, call and
    teardown)."""
    import xml.etree.ElementTree as ET

    root = Path(__file__).parent.parent
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        # classname: tests.e2e.test_serving, or with a class (any case) after the module
        parts = case.get("classname", "").split(".")
        files = ["/".join(parts[:n]) + ".py" for n in range(len(parts), 0, -1)]
        module = next((f for f in files if (root / f).is_file()), files[0])
        seconds[module] += float(case.get("time", 0))
    return {f: round(s, 1) for f, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    json.dump(from_junit(sys.argv[1]), sys.stdout, indent=0)
    sys.stdout.write("\n")
