"""radixlm/registry.py: the one plug-in pattern (names in registration order, decorator or lazy
dotted-path entries, metadata without loading, unknown names listing the choices)."""

from __future__ import annotations

import importlib
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


# ----------------------------------------------------------------------------- radixlm's registries
RADIXLM_REGISTRIES = [
    ("radixlm.model.registry", "MODEL_REGISTRY"),
    ("radixlm.model.gguf.registry", "GGUF_ARCHITECTURE_REGISTRY"),
    ("radixlm.model.layers.attention.registry", "ATTENTION_BACKEND_REGISTRY"),
    ("radixlm.cache.factory", "PREFIX_CACHE_REGISTRY"),
    ("radixlm.cache.hicache_config", "STORAGE_BACKEND_REGISTRY"),
    ("radixlm.scheduler.batching.policy", "SCHEDULE_POLICY_REGISTRY"),
    ("radixlm.speculative.config", "DRAFT_SOURCE_REGISTRY"),
    ("radixlm.router.policies", "ROUTER_POLICY_REGISTRY"),
    ("radixlm.constrained", "GRAMMAR_BACKEND_REGISTRY"),
    ("radixlm.function_call.registry", "TOOL_CALL_PARSER_REGISTRY"),
    ("radixlm.reasoning.formats", "REASONING_PARSER_REGISTRY"),
    ("radixlm.model.quant.methods", "QUANTIZATION_REGISTRY"),
    ("radixlm.model.quant.checkpoint", "CHECKPOINT_PARSER_REGISTRY"),
    ("radixlm.model.layers.linear_attn", "LINEAR_ATTN_BACKEND_REGISTRY"),
]


@pytest.mark.parametrize("module, attr", RADIXLM_REGISTRIES)
def test_every_entry_of_radixlm_loads(module, attr):
    """A dotted path is checked only when looked up: a typo would wait for the first server that
    chooses the entry. An optional package that is not installed is the one exception."""
    reg = getattr(importlib.import_module(module), attr)
    assert isinstance(reg, Registry) and reg.names()
    for name in reg:
        try:
            entry = reg.get(name)
        except ModuleNotFoundError as e:
            if (e.name or "radixlm").startswith("radixlm"):
                raise
            continue  # e.g. xgrammar
        assert entry is not None, name
        if attr in ("TOOL_CALL_PARSER_REGISTRY", "REASONING_PARSER_REGISTRY"):
            fmt = entry() if attr == "TOOL_CALL_PARSER_REGISTRY" else entry
            assert fmt.name == name


def test_the_cli_choices_are_the_registries_names():
    from radixlm.cli import option_choices

    choices = option_choices()
    owners = {attr: module for module, attr in RADIXLM_REGISTRIES}
    for field, attr in [
        ("attention_backend", "ATTENTION_BACKEND_REGISTRY"),
        ("schedule_policy", "SCHEDULE_POLICY_REGISTRY"),
        ("speculative_algorithm", "DRAFT_SOURCE_REGISTRY"),
        ("grammar_backend", "GRAMMAR_BACKEND_REGISTRY"),
        ("hicache_storage_backend", "STORAGE_BACKEND_REGISTRY"),
        ("tool_call_parser", "TOOL_CALL_PARSER_REGISTRY"),
        ("reasoning_parser", "REASONING_PARSER_REGISTRY"),
        ("quantization", "QUANTIZATION_REGISTRY"),
    ]:
        registry = getattr(importlib.import_module(owners[attr]), attr)
        extra = ("none",) if field == "quantization" else ()  # float weights: no method
        assert choices[field] == extra + registry.names(), field
    # the recurrences' kernels: auto, or one by name
    from radixlm.model.layers.linear_attn import LINEAR_ATTN_BACKEND_REGISTRY

    assert choices["linear_attn_backend"] == ("auto", *LINEAR_ATTN_BACKEND_REGISTRY.names())


def test_loading_the_model_code_imports_no_model_until_one_is_named():
    """Start-up: the model registry is dotted paths, so no module of model/models/ is imported by
    the loader until a checkpoint names its architecture."""
    code = (
        "import sys\n"
        "import radixlm.model.loader\n"
        "from radixlm.model.registry import get_model_class\n"
        "models = lambda: sorted(m for m in sys.modules if m.startswith('radixlm.model.models.'))\n"
        "assert models() == [], models()\n"
        "assert get_model_class('Qwen3ForCausalLM').__name__ == 'Qwen3ForCausalLM'\n"
        "assert 'radixlm.model.models.qwen3' in models() and 'radixlm.model.models.gemma3' not in"
        " models()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
