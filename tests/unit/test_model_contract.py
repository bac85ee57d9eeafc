"""The contract between a model and the runner is typed (radixlm/model/traits.py): the runner's side
asks a model what it is through `traits()` and a module what it can do through isinstance against a
Protocol, never by probing an attribute by name.

The rule, checked on the AST of the runner's side — every module directly in radixlm/model/ (the
runner and its helpers: loader, memory pools, pooler, static decode, weight updates, ...) and every
module of radixlm/model/quant/ and radixlm/model/gguf/ (archs included); not the families
(radixlm/model/models/) nor the layers (radixlm/model/layers/):
- no `hasattr(...)` call at all;
- `getattr(obj, "<constant name>", ...)` only where obj is a Hugging Face object or the command's
  arguments, by its name: a bare name or an attribute named one of CONFIG_NAMES (config, cfg,
  hf_config, text_config, args, tokenizer, transformers). A getattr whose name is computed (a
  dataclass's fields in a loop) is no probe of an optional attribute and passes.

The checker also runs on small sources with and without the fault, so that a pass means the probes
are absent, not that the checker is blind.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "radixlm" / "model"
CONFIG_NAMES = frozenset(
    {"config", "cfg", "hf_config", "text_config", "args", "tokenizer", "transformers"}
)


def runner_side_modules() -> list[Path]:
    top = sorted(MODEL.glob("*.py"))
    packages = ("executor", "memory", "quant", "gguf")
    return top + [p for pkg in packages for p in sorted((MODEL / pkg).rglob("*.py"))]


def _receiver_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def probes(source: str) -> list[tuple[int, str]]:
    """(line, what) for each name probe in `source` under the rule above."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "hasattr":
            out.append((node.lineno, f"hasattr({ast.unparse(node.args[0])}, ...)"))
        elif node.func.id == "getattr" and len(node.args) >= 2:
            obj, name = node.args[0], node.args[1]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            if _receiver_name(obj) not in CONFIG_NAMES:
                out.append((node.lineno, f"getattr({ast.unparse(obj)}, {name.value!r})"))
    return out


# ----------------------------------------------------------------------------- the checker's own
@pytest.mark.parametrize(
    "source, found",
    [
        ("x = hasattr(model, 'state_specs')", ["hasattr(model, ...)"]),
        ("x = getattr(self.model, 'num_kv_layers', 0)", ["getattr(self.model, 'num_kv_layers')"]),
        ("x = getattr(getattr(model, 'pp', None), 'size', 1)", 2),
        ("x = getattr(m, 'tp_size', 1)", ["getattr(m, 'tp_size')"]),
        ("x = getattr(config, 'head_dim', None)", []),
        ("x = getattr(self.hf_config, 'head_dim', None)", []),
        ("x = getattr(args, 'disaggregation_mode', 'null')", []),
        ("x = [getattr(self, f) for f in fields]", []),
        ("x = model.traits().encoder_only", []),
        ("x = isinstance(m, FinishesLoading)", []),
    ],
)
def test_checker_sees_probes(source, found):
    got = [what for _, what in probes(textwrap.dedent(source))]
    if isinstance(found, int):
        assert len(got) == found, got
    else:
        assert got == found


def test_checker_scope_is_the_runner_side():
    names = {p.relative_to(MODEL).as_posix() for p in runner_side_modules()}
    assert {"executor/runner.py", "loader.py", "memory/state_memory.py"} <= names
    assert "quant/awq_gptq.py" in names
    assert {"gguf/loader.py", "gguf/archs/llama.py"} <= names
    assert not any(n.startswith(("models/", "layers/")) for n in names)


# ----------------------------------------------------------------------------- the rule
def test_no_name_probes_between_runner_and_models():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in runner_side_modules()
        for line, what in probes(path.read_text())
    ]
    assert not found, (
        "the runner's side probes a model or module by attribute name; ask "
        "model.traits() (radixlm/model/traits.py: ModelTraits) or isinstance against a "
        "Protocol there instead:\n" + "\n".join(found)
    )


def test_every_registered_model_is_a_served_model():
    """The loader reads `encoder_only` off the class and the runner calls `traits()`: every class
    the registry names derives from ServedModel."""
    from radixlm.model.registry import MODEL_REGISTRY
    from radixlm.model.traits import ServedModel

    names = MODEL_REGISTRY.names()
    assert names
    for name in names:
        cls = MODEL_REGISTRY.get(name)
        assert issubclass(cls, ServedModel), name


def test_traits_agree_with_what_each_class_defines():
    """A family that gains `forward_idle`, `state_specs`, `kv_shared_layers` or `takes_quantized`
    declares it in its traits (the runner reads only those). Each class's traits() runs on a bare
    instance holding the few attributes the families read."""
    from types import SimpleNamespace

    from torch import nn

    from radixlm.model.registry import MODEL_REGISTRY

    for name in MODEL_REGISTRY.names():
        cls = MODEL_REGISTRY.get(name)
        model = cls.__new__(cls)
        nn.Module.__init__(model)
        model.tie_word_embeddings = False
        model.encoder_cache = None
        model.config = SimpleNamespace(max_position_embeddings=16)
        inner = SimpleNamespace(num_kv_layers=2, kv_source=[0, 1, 1])
        object.__setattr__(model, "model", inner)
        object.__setattr__(model, "language_model", inner)
        traits = model.traits()
        assert (
            traits.supports_forward_idle,
            traits.is_hybrid,
            bool(traits.kv_shared_layers),
            traits.loads_quantized_weights,
            traits.modalities != ("text",),
        ) == (
            hasattr(cls, "forward_idle"),
            hasattr(cls, "state_specs"),
            hasattr(cls, "kv_shared_layers"),
            hasattr(cls, "takes_quantized"),
            hasattr(cls, "encode_images"),
        ), name
