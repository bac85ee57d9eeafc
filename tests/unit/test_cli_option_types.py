"""Every `radixlm serve` option parses to its field's type (an optional number too: `int | None`
fields once parsed as text, so `--num-threads 2` failed at start-up)."""

import argparse
import dataclasses

import pytest

from radixlm.config import ServerArgs

NUMBERS = {"int": int, "float": float, "int | None": int, "float | None": float}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p


@pytest.mark.parametrize(
    "field",
    [f for f in dataclasses.fields(ServerArgs) if str(f.type) in NUMBERS],
    ids=lambda f: f.name,
)
def test_a_number_option_parses_to_its_type(field):
    flag = "--" + field.name.replace("_", "-")
    value = getattr(_parser().parse_args([flag, "2"]), field.name)
    assert type(value) is NUMBERS[str(field.type)] and value == 2


def test_list_options_take_several_values():
    fields = [f for f in dataclasses.fields(ServerArgs) if str(f.type).startswith("list")]
    assert fields
    for f in fields:
        flag = "--" + f.name.replace("_", "-")
        if "list[int]" in str(f.type):  # items parse to their type (--cuda-graph-bs 1 2)
            assert getattr(_parser().parse_args([flag, "1", "2"]), f.name) == [1, 2]
        else:
            assert getattr(_parser().parse_args([flag, "a", "b"]), f.name) == ["a", "b"]
