"""radixlm/registry.py: the one plug-in pattern (names in registration order, decorator or lazy
dotted-path entries, metadata without loading, unknown names listing the choices)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from radixlm.registry import Registry, UnknownNameError, import_dotted


@dataclass(frozen=True)
class Info:
    cheap: bool = False


def test_decorator_and_direct_entries_in_registration_order():
    reg = Registry[object, Info]("widget")

    @reg.register("b", meta=Info(cheap=True))
    def make_b():
        return "b"

    assert make_b() == "b"  # the decorator returns what it decorates
    assert reg.register("a", len, Info()) is None
    assert reg.names() == ("b", "a") and list(reg) == ["b", "a"] and len(reg) == 2
    assert reg.get("b") is make_b and reg.get("a") is len
    assert reg.meta("b") == Info(cheap=True) and reg.meta("a") == Info()
    assert "a" in reg and "c" not in reg and None not in reg and ["a"] not in reg


def test_entries_without_metadata_have_none():
    reg = Registry[object, None]("widget")
    reg.register("x", 1)
    assert reg.meta("x") is None


def test_a_lazy_entry_is_imported_at_its_first_lookup_only():
    """The dotted path is a module and an attribute path; nothing is imported at registration."""
    code = (
        "import sys\n"
        "from radixlm.registry import Registry\n"
        "reg = Registry('codec')\n"
        "reg.register('json', 'json.decoder:JSONDecoder.decode', meta='m')\n"
        "assert 'json.decoder' not in sys.modules and reg.meta('json') == 'm'\n"
        "import json.decoder\n"
        "assert reg.get('json') is json.decoder.JSONDecoder.decode\n"
        "assert reg.get('json') is json.decoder.JSONDecoder.decode\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert import_dotted("os.path:join") is __import__("os").path.join


def test_a_bad_dotted_path_is_refused_at_registration_and_a_missing_one_at_lookup():
    reg = Registry[object, None]("widget")
    for bad in ("os.path", "os.path:", ":join", "os path:join"):
        with pytest.raises(ValueError, match="a lazy widget is 'package.module:attribute'"):
            reg.register("w", bad)
    reg.register("gone", "radixlm.no_such_module:Thing")
    with pytest.raises(ModuleNotFoundError):
        reg.get("gone")
    reg.register("typo", "os.path:no_such_function")
    with pytest.raises(AttributeError):
        reg.get("typo")


def test_unknown_names_list_the_choices_as_value_and_key_errors():
    reg = Registry[int, None]("widget")
    reg.register("one", 1)
    reg.register("two", 2)
    with pytest.raises(UnknownNameError, match=r"^unknown widget 'three'; choose from one, two$"):
        reg.get("three")
    for error in (ValueError, KeyError):  # option checks and mapping-style callers alike
        with pytest.raises(error):
            reg.meta("three")
    with pytest.raises(UnknownNameError, match="unknown widget None"):
        reg.get(None)  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError):
        reg.get(["one"])  # type: ignore[arg-type]  (unhashable)


def test_a_point_keeps_its_own_unknown_message():
    reg = Registry[int, None]("policy", unknown="policy must be one of {names}, got {name!r}")
    reg.register("a", 1)
    assert str(reg.unknown("z")) == "policy must be one of ('a',), got 'z'"
    with pytest.raises(ValueError, match=r"^policy must be one of \('a',\), got 'z'$"):
        reg.get("z")


def test_a_name_registers_once_and_unregisters():
    reg = Registry[int, None]("widget")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="widget 'a' is registered already"):
        reg.register("a", 2)
    del reg["a"]
    assert reg.names() == ()
    with pytest.raises(KeyError, match="unknown widget 'a'"):
        del reg["a"]
    reg.register("a", 3)
    assert reg.get("a") == 3


def test_importing_the_registry_imports_no_torch():
    """A leaf: the router and the pure text parsers import it."""
    code = "import sys, radixlm.registry; assert 'torch' not in sys.modules, 'torch imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
