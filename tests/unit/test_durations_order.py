"""tests/durations.py: the run's order (longest files first, a file's tests together and in their
order) and the table's regeneration from a JUnit report."""

from types import SimpleNamespace

from tests import durations


def test_longest_files_first_each_file_in_its_order():
    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2", "new.py::t1"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    durations.order_longest_first(items, {"a.py": 5.0, "b.py": 50.0, "c.py": 5.0})
    assert [i.nodeid for i in items] == [
        "b.py::t1",
        "b.py::t2",
        "a.py::t1",
        "a.py::t2",
        "c.py::t1",
        "new.py::t1",  # not measured yet: last
    ]


def test_table_from_a_junit_report(tmp_path):
    """A class's tests (hypothesis's state machines: a lowercase class) count for their file."""
    report = tmp_path / "run.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.test_serving" name="test_a" time="2.5"/>'
        '<testcase classname="tests.e2e.test_serving" name="test_b" time="1.0"/>'
        '<testcase classname="tests.unit.test_durations_order.machine" name="t" time="0.3"/>'
        "</testsuite></testsuites>"
    )
    assert durations.from_junit(str(report)) == {
        "tests/e2e/test_serving.py": 3.5,
        "tests/unit/test_durations_order.py": 0.3,
    }
    assert list(durations.from_junit(str(report))) == [
        "tests/e2e/test_serving.py",
        "tests/unit/test_durations_order.py",
    ]


def test_the_committed_table_names_existing_files():
    from pathlib import Path

    root = Path(durations.__file__).parent.parent
    table = durations.load()
    assert table, "tests/durations.json is missing"
    assert all((root / f).is_file() for f in table), [f for f in table if not (root / f).is_file()]
