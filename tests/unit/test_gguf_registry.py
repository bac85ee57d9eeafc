"""The GGUF architectures as one registry (radixlm/model/gguf/registry.py): every architecture
radixlm reads is registered and maps to a model radixlm has; the generic loader has no
per-architecture branch (checked on its source, and the checker on a faulty snippet); no module of
the package imports another's private name; an unknown architecture keeps its error message."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from radixlm.model.gguf.registry import GGUF_ARCHITECTURE_REGISTRY
from radixlm.model.registry import MODEL_REGISTRY

PACKAGE = Path(__file__).resolve().parents[2] / "radixlm" / "model" / "gguf"
# llama.cpp's general.architecture names radixlm reads, in the order the unknown-name error lists.
ARCHITECTURES = (
    "llama",
    "qwen2",
    "qwen3",
    "smollm3",
    "olmo2",
    "phi3",
    "gemma2",
    "gemma3",
    "qwen2moe",
    "qwen3moe",
    "olmoe",
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "nemotron_h",
    "nemotron_h_moe",
    "lfm2",
    "lfm2moe",
    "granitehybrid",
    "falcon-h1",
    "gpt-oss",
    "gemma3n",
    "gemma4",
    "llama4",
    "kimi-linear",
    "deepseek2",
    "deepseek32",
    "glm4moe",
    "minimax-m2",
    "dots1",
    "hunyuan-moe",
    "glm4",
    "granite",
    "granitemoe",
    "cohere2",
    "exaone4",
    "seed_oss",
    "apertus",
    "arcee",
    "ernie4_5",
    "ernie4_5-moe",
    "hunyuan-dense",
    "mistral3",
    "mamba2",
    "mamba",
    "jamba",
    "qwen3vl",
    "qwen3vlmoe",
)


def arch_branches(source: str) -> list[str]:
    """Where `source` branches on an architecture: a name like `arch` compared to a string, or
    tested for membership in anything but the registry."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = [ast.unparse(o) for o in operands]
        if not any("arch" in n.lower() for n in names):
            continue
        strings = any(isinstance(o, ast.Constant) and isinstance(o.value, str) for o in operands)
        member = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        if strings or (member and "GGUF_ARCHITECTURE_REGISTRY" not in names):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def core_modules() -> list[Path]:
    """The package's generic modules: all but the families of archs/."""
    return sorted(p for p in PACKAGE.glob("*.py"))


def test_registered_architectures_and_their_models():
    assert GGUF_ARCHITECTURE_REGISTRY.names() == ARCHITECTURES
    import transformers

    for arch in ARCHITECTURES:
        spec = GGUF_ARCHITECTURE_REGISTRY.get(arch)
        for model in [spec.model, *(v.model for v in spec.variants)]:
            assert model.architecture in MODEL_REGISTRY, (arch, model)
            assert hasattr(transformers, model.config_class), (arch, model)
        assert list(inspect.signature(spec.config).parameters) == ["reader", "arch", "kw"], arch


def test_the_loader_has_no_per_architecture_branch():
    for path in core_modules():
        assert arch_branches(path.read_text()) == [], path.name


def test_the_branch_checker_sees_a_branch():
    faulty = textwrap.dedent(
        """
        def gguf_config(reader):
            arch = field(reader, "general.architecture")
            if arch == "llama":
                pass
            if arch in QWEN35_ARCHITECTURES:
                pass
            if field(reader, "general.architecture") != "phi3":
                pass
            if arch not in GGUF_ARCHITECTURE_REGISTRY:  # the one lookup allowed
                pass
        """
    )
    assert len(arch_branches(faulty)) == 3


def test_no_private_name_is_imported_across_modules():
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("radixlm."):
                private += [
                    f"{path.name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert private == []


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class _Reader:
    """What the loader reads of a file whose metadata names `arch` and holds nothing else."""

    def __init__(self, arch: str | None):
        self.fields = {} if arch is None else {"general.architecture": _Field(arch)}
        self.tensors = []


@pytest.mark.parametrize("arch", ["gpt2", None])
def test_unknown_architecture_keeps_its_message(arch):
    from radixlm.model.gguf.loader import gguf_architecture, gguf_config

    message = f"unsupported GGUF architecture {arch!r}; radixlm reads: {', '.join(ARCHITECTURES)}"
    for read in (gguf_architecture, gguf_config):
        with pytest.raises(ValueError) as e:
            read(_Reader(arch))
        assert str(e.value) == message
