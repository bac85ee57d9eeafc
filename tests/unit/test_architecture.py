"""The architecture as tests: the import contracts of pyproject.toml ([tool.importlinter]: the
layers, the leaves, the independent router, no cycle between siblings), no import cycle between
modules, no module past 500 lines and no class past 400 (radixlm/ only) counting the radixlm mixins
it inherits, no mixin that only one class uses, no class that subclasses a null object, and no
private name of a radixlm.server module imported by another module.
TYPE_CHECKING and lazy (function-level) imports count like any other: a cycle through them is
still a cycle to untangle.

Each checker also runs on a small package written to a temp dir, with and without the fault it looks
for, so that a pass means the fault is absent, not that the checker is blind.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "radixlm"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 400
# Generated tables exempt from the size limits (paths relative to radixlm/); none today.
GENERATED: frozenset[str] = frozenset()
# A null object's name: No + a capitalized name (NoLoRA, NoSpeculation; not Node).
NULL_OBJECT = re.compile(r"No[A-Z]")


# ----------------------------------------------------------------------------- the checkers
def lint_imports(
    cwd: Path, config: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess:
    """import-linter's command on `config`, run from `cwd` (its packages importable from there)."""
    env = {**os.environ, "COLUMNS": "200"}  # import chains unwrapped in the report
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-c",
        "from importlinter.cli import lint_imports_command; lint_imports_command()",
        str(config),
        "--no-cache",
        "--no-logo",
    ]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def import_graph(package: str) -> grimp.ImportGraph:
    # cache_dir=None: nothing written into the checkout.
    return grimp.build_graph(
        package,
        include_external_packages=False,
        exclude_type_checking_imports=False,
        cache_dir=None,
    )


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def shortest_cycle(graph: grimp.ImportGraph, component: list[str], start: str) -> list[str]:
    """A shortest import cycle through `start` inside its component: [start, ..., start]."""
    members = set(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph.find_modules_directly_imported_by(v) & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is on no cycle of {component}")


def describe_cycle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """The component, and one shortest cycle through each member (with the importing lines)."""
    lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
    seen = set()
    for m in component:
        cycle = shortest_cycle(graph, component, m)
        key = frozenset(zip(cycle, cycle[1:]))
        if key in seen:
            continue
        seen.add(key)
        steps = []
        for a, b in zip(cycle, cycle[1:]):
            where = ", ".join(
                f"l.{d['line_number']}" for d in graph.get_import_details(importer=a, imported=b)
            )
            steps.append(f"    {a} -> {b} ({where})")
        lines += ["  " + " -> ".join(cycle)] + steps
    return "\n".join(lines)


ClassKey = tuple[str, int]  # (module, line of its `class` statement)


@dataclass(frozen=True)
class ClassInfo:
    rel: str  # its module's path relative to the package directory
    name: str
    lines: int  # decorators included
    bases: tuple[ClassKey, ...]  # those of its bases that are classes of the package


def package_classes(package_dir: Path) -> dict[ClassKey, ClassInfo]:
    """Every class of the package with those of its bases that are classes of the package too (a
    base from elsewhere, or one that cannot be resolved statically, is left out). Bases resolve
    through the module's imports (function-level ones included), re-exports and module attributes
    (`mod.Base`)."""
    trees: dict[str, tuple[Path, ast.Module]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        trees[module] = (path, ast.parse(path.read_text(), filename=str(path)))
    defs: dict[str, list[ast.ClassDef]] = {}
    imports: dict[str, dict[str, tuple[str, str | None]]] = {}  # name -> (module, attribute)
    for module, (path, tree) in trees.items():
        defs[module] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        names = imports[module] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:  # relative: from the package, node.level - 1 packages up
                    up = package[: len(package) - node.level + 1]
                    source = ".".join([*up, *([node.module] if node.module else [])])
                for a in node.names:
                    names[a.asname or a.name] = (source, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    top = a.name.split(".")[0]
                    names[a.asname or top] = (a.name if a.asname else top, None)

    def defined(module: str, name: str, hops: int = 0) -> ClassKey | None:
        """The class `name` means in `module`: its own, or one it imports (followed)."""
        own = [c for c in defs.get(module, ()) if c.name == name]
        if own:
            return (module, own[0].lineno)
        source, attr = imports.get(module, {}).get(name, (None, None))
        if attr is None or f"{source}.{attr}" in trees or hops > 20:  # a module, not a class
            return None
        return defined(source, attr, hops + 1)

    def resolve(module: str, expr: ast.expr) -> ClassKey | None:
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[int]
            return resolve(module, expr.value)
        if isinstance(expr, ast.Name):
            return defined(module, expr.id)
        chain = []  # mod.sub.Base: the names after the first
        while isinstance(expr, ast.Attribute):
            chain.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name) or expr.id not in imports[module]:
            return None
        source, attr = imports[module][expr.id]
        *path, name = [source, *([attr] if attr else []), *chain]
        return defined(".".join(path), name)

    return {
        (module, c.lineno): ClassInfo(
            path.relative_to(package_dir).as_posix(),
            c.name,
            c.end_lineno - min([c.lineno] + [d.lineno for d in c.decorator_list]) + 1,
            tuple(k for k in (resolve(module, b) for b in c.bases) if k is not None),
        )
        for module, (path, _) in trees.items()
        for c in defs[module]
    }


def inherited(key: ClassKey, classes: dict[ClassKey, ClassInfo]) -> set[ClassKey]:
    """The package's classes that `key` inherits from, at any depth (each once)."""
    seen: set[ClassKey] = set()
    todo = list(classes[key].bases)
    while todo:
        base = todo.pop()
        if base not in seen:
            seen.add(base)
            todo.extend(classes[base].bases)
    return seen


def oversized(package_dir: Path, exempt: frozenset[str] = frozenset()) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and classes over MAX_CLASS_LINES (decorators included). A
    class counts with the package's mixins it inherits (at any depth): code moved into a mixin is
    still the class's to read."""
    classes = package_classes(package_dir)
    out = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if rel in exempt:
            continue
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            out.append(f"module {rel}: {n} lines (max {MAX_MODULE_LINES})")
        for key, c in classes.items():
            if c.rel != rel:
                continue
            # Mixins (bases named *Mixin), not base classes: a subclass of a real base (a cache
            # tier over RadixCache) is that base's kind; a mixin is one class's code moved out.
            bases = {b for b in inherited(key, classes) if classes[b].name.endswith("Mixin")}
            size = c.lines + sum(classes[b].lines for b in bases)
            if size > MAX_CLASS_LINES:
                more = f" with {', '.join(sorted(classes[b].name for b in bases))}" if bases else ""
                out.append(f"class {rel}:{c.name}: {size} lines{more} (max {MAX_CLASS_LINES})")
    return out


def single_use_mixins(package_dir: Path) -> list[str]:
    """Classes named *Mixin that fewer than two classes of the package inherit from directly. A
    mixin shares behaviour between classes; one with a single user is that class split in two."""
    classes = package_classes(package_dir)
    users: dict[ClassKey, list[str]] = {
        k: [] for k, c in classes.items() if c.name.endswith("Mixin")
    }
    for c in classes.values():
        for b in c.bases:
            if b in users:
                users[b].append(c.name)
    return [
        f"mixin {classes[k].rel}:{classes[k].name}: inherited by {', '.join(u) or 'no class'} only"
        for k, u in sorted(users.items())
        if len(u) < 2
    ]


def _base_name(base: ast.expr) -> str | None:
    """The class a base expression names: NoX, module.NoX, NoX[T] -> NoX (None: a call, ...)."""
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    if isinstance(base, ast.Name):
        return base.id
    return None


def null_object_subclasses(package_dir: Path) -> list[str]:
    """Classes that subclass a null object (NULL_OBJECT): a real class that forgot an override
    would silently inherit a no-op. The no-op and the real class implement one interface side by
    side instead (an ABC whose methods are abstract: a forgotten one fails at construction)."""
    out = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = _base_name(base)
                    if name is not None and NULL_OBJECT.match(name):
                        out.append(f"{rel}:{node.lineno}: class {node.name}({name})")
    return out


def private_imports(package_dir: Path, source_prefix: str) -> list[str]:
    """`from M import _name` where M is a module under `source_prefix` and not the importer itself:
    one module reaching into another's private names (an adapter into another adapter's helpers)
    instead of a shared module with public ones."""
    out = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module != source_prefix and not node.module.startswith(source_prefix + "."):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{rel}:{node.lineno}: from {node.module} import {a.name}")
    return out


# ----------------------------------------------------------------------------- radixlm
def test_import_contracts_are_kept():
    r = lint_imports(ROOT, ROOT / "pyproject.toml")
    report = r.stdout + r.stderr
    print(report)
    assert "Contracts:" in report, report  # the contracts ran (a config error reads otherwise)
    assert r.returncode == 0, "broken import contracts:\n" + report


def test_contracts_are_the_designed_ones():
    """The contracts stay as strong as designed: every one present, TYPE_CHECKING imports
    counted."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert cfg["root_package"] == PACKAGE and cfg.get("include_external_packages") is True
    assert not cfg.get("exclude_type_checking_imports", False)
    contracts = {c["id"]: c for c in cfg["contracts"]}
    assert set(contracts) == {"layers", "leaves", "router", "acyclic", "scheduler"}
    for c in contracts.values():
        assert not c.get("ignore_imports") and not c.get("exclude_type_checking_imports", False), c[
            "id"
        ]
    assert contracts["layers"]["layers"] == [
        "radixlm.cli",
        "radixlm.bench | radixlm.lang",
        "radixlm.server",
        "radixlm.engine",
        "radixlm.scheduler",
        "radixlm.disaggregation",
        "radixlm.speculative | radixlm.constrained",
        "radixlm.model",
        "radixlm.lora",
        "radixlm.distributed",
        "radixlm.cache",
        "radixlm.kernels",
        "radixlm.function_call | radixlm.reasoning",
    ]
    packages = {p.strip() for layer in contracts["layers"]["layers"] for p in layer.split("|")}
    assert set(contracts["leaves"]["source_modules"]) == {
        "radixlm.ipc",
        "radixlm.config",
        "radixlm.sampling_params",
        "radixlm.sampling_checks",
        "radixlm.utils",
        "radixlm.http_common",
        "radixlm.radix_walk",
        "radixlm.errors",
        "radixlm.version",
        "radixlm.stop_match",
        "radixlm.http_access",
        "radixlm.http_dashboard",
        "radixlm.mm_inputs",
        "radixlm.config_help",
        "radixlm.registry",
        "radixlm.kv_event_schema",
        "radixlm.kv_block_hash",
    }
    assert packages <= set(contracts["leaves"]["forbidden_modules"])
    assert contracts["router"]["source_modules"] == ["radixlm.router"]
    assert packages | {"torch"} <= set(contracts["router"]["forbidden_modules"])
    assert contracts["acyclic"]["ancestors"] == ["radixlm"]
    # The scheduler by concern: every module and subpackage of radixlm/scheduler has its layer.
    assert contracts["scheduler"]["containers"] == ["radixlm.scheduler"]
    named = {p.strip() for layer in contracts["scheduler"]["layers"] for p in layer.split("|")}
    scheduler_dir = ROOT / PACKAGE / "scheduler"
    present = {p.stem for p in scheduler_dir.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in scheduler_dir.iterdir() if (p / "__init__.py").exists()
    }
    assert named == present, f"not layered: {present - named}; gone: {named - present}"


def test_no_import_cycle_between_modules():
    graph = import_graph(PACKAGE)
    cycles = import_cycles(graph)
    report = "\n\n".join(describe_cycle(graph, c) for c in cycles)
    print(report)
    assert not cycles, f"{len(cycles)} import cycles:\n{report}"


def test_no_oversized_module_or_class():
    big = oversized(ROOT / PACKAGE, GENERATED)
    assert not big, "\n".join(big)


def test_no_mixin_that_splits_one_class():
    split = single_use_mixins(ROOT / PACKAGE)
    assert not split, "\n".join(split)


def test_no_class_subclasses_a_null_object():
    found = null_object_subclasses(ROOT / PACKAGE)
    assert not found, (
        "subclasses of a null object (implement the interface instead):\n" + "\n".join(found)
    )


# ----------------------------------------------------------------------------- the checkers checked
def test_no_adapter_imports_a_private_name_of_another_server_module():
    """The APIs' routes share public helpers (server/chat_pipeline.py, model_names.py, ...), never
    another adapter's private ones."""
    found = private_imports(ROOT / PACKAGE, f"{PACKAGE}.server")
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def write_package(root: Path, name: str, modules: dict[str, str]) -> None:
    pkg = root / name
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    for mod, src in modules.items():
        (pkg / f"{mod}.py").write_text(textwrap.dedent(src))


def test_cycle_finder_sees_type_checking_and_lazy_imports(tmp_path, monkeypatch):
    name = "archfixture_cycles"
    monkeypatch.syspath_prepend(str(tmp_path))
    write_package(
        tmp_path,
        name,
        {
            # a -> b only inside a function, b -> a only under TYPE_CHECKING: still a cycle.
            "a": f"def f():\n    from {name} import b\n    return b\n",
            "b": (
                f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {name}.a import f\n"
            ),
            "c": f"from {name} import a\n",  # on no cycle
            "d": f"import {name}.e\n",
            "e": f"import {name}.f\n",
            "f": f"import {name}.d\n",
        },
    )
    graph = import_graph(name)
    cycles = import_cycles(graph)
    assert cycles == [[f"{name}.a", f"{name}.b"], [f"{name}.d", f"{name}.e", f"{name}.f"]]
    text = describe_cycle(graph, cycles[0])
    assert f"{name}.a -> {name}.b (l.2)" in text and f"{name}.b -> {name}.a (l.3)" in text
    assert shortest_cycle(graph, cycles[1], f"{name}.e") == [
        f"{name}.e",
        f"{name}.f",
        f"{name}.d",
        f"{name}.e",
    ]

    (tmp_path / name / "b.py").write_text("")
    (tmp_path / name / "f.py").write_text("")
    assert import_cycles(import_graph(name)) == []


CONTRACTS = """
[tool.importlinter]
root_package = "{name}"
include_external_packages = true

[[tool.importlinter.contracts]]
name = "layers"
type = "layers"
layers = ["{name}.top", "{name}.bottom"]

[[tool.importlinter.contracts]]
name = "no ext"
type = "forbidden"
source_modules = ["{name}.top"]
forbidden_modules = ["{ext}"]
"""


def test_contract_check_fails_on_violations_and_passes_without(tmp_path):
    name, ext = (
        "archfixture_layers",
        "archfixture_external",
    )  # ext: outside the root package, like torch
    write_package(tmp_path, ext, {})
    write_package(
        tmp_path,
        name,
        {
            # A lazy import of the forbidden external package...
            "top": f"from {name} import bottom\n\ndef f():\n    import {ext}\n",
            # ... and a layer violation under TYPE_CHECKING: both must count.
            "bottom": (
                f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {name} import top\n"
            ),
        },
    )
    config = tmp_path / "pyproject.toml"
    config.write_text(CONTRACTS.format(name=name, ext=ext))
    r = lint_imports(tmp_path, config, pythonpath=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "0 kept, 2 broken" in out, out
    assert f"{name}.bottom is not allowed to import {name}.top" in out, out
    assert f"{name}.top is not allowed to import {ext}" in out, out

    (tmp_path / name / "top.py").write_text(f"from {name} import bottom\n")
    (tmp_path / name / "bottom.py").write_text("")
    r = lint_imports(tmp_path, config, pythonpath=tmp_path)
    assert r.returncode == 0 and "2 kept, 0 broken" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "module_lines, class_lines, flagged",
    [
        (MAX_MODULE_LINES, 10, []),
        (MAX_MODULE_LINES + 1, 10, ["module"]),
        (MAX_CLASS_LINES + 20, MAX_CLASS_LINES, []),
        (MAX_CLASS_LINES + 20, MAX_CLASS_LINES + 1, ["class"]),
    ],
)
def test_size_check(tmp_path, module_lines, class_lines, flagged):
    body = ["class Big:"] + ["    x = 0"] * (class_lines - 1)
    lines = body + ["# filler"] * (module_lines - len(body))
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n")
    found = oversized(tmp_path)
    assert [f.split()[0] for f in found] == flagged, found
    assert oversized(tmp_path, exempt=frozenset({"m.py"})) == []


INHERITED = {
    # A base class and a mixin elsewhere in the package, one re-exported.
    "base": "class Base:\n" + "    x = 0\n" * 199,
    "mixins": "class HelperMixin:\n" + "    y = 0\n" * 249,
    "reexport": "from {name}.mixins import HelperMixin as Helper\n",
}


@pytest.mark.parametrize(
    "header, bases, size",
    [
        ("from {name}.mixins import HelperMixin", "HelperMixin", 451),  # 201 + the mixin's 250
        ("from .mixins import HelperMixin", "HelperMixin", 451),
        ("import {name}.mixins as m", "m.HelperMixin", 451),
        (
            "from {name} import base, reexport",
            "reexport.Helper, base.Base",
            451,
        ),  # Base not counted
        ("from {name}.base import Base", "Base", None),  # a base class: 201 lines of its own
        ("from collections import OrderedDict", "OrderedDict", None),  # not the package's
        ("", "", None),
    ],
)
def test_size_check_counts_the_mixins_a_class_inherits(tmp_path, header, bases, size):
    name = "archfixture_inherit"
    write_package(tmp_path, name, {k: v.format(name=name) for k, v in INHERITED.items()})
    body = [f"class Small({bases}):"] + ["    z = 0"] * 200
    (tmp_path / name / "small.py").write_text(
        header.format(name=name) + "\n" + "\n".join(body) + "\n"
    )
    found = oversized(tmp_path / name)
    if size is None:
        assert found == [], found
    else:
        assert len(found) == 1 and found[0].startswith(f"class small.py:Small: {size} lines with ")


@pytest.mark.parametrize("users, flagged", [(0, True), (1, True), (2, False)])
def test_mixin_check(tmp_path, users, flagged):
    name = "archfixture_mixins"
    classes = "".join(f"class User{i}(SplitMixin):\n    pass\n" for i in range(users))
    modules = {
        "mixin": "class SplitMixin:\n    pass\n",
        "users": f"from {name}.mixin import SplitMixin\n{classes}",
    }
    write_package(tmp_path, name, modules)
    found = single_use_mixins(tmp_path / name)
    if flagged:
        assert len(found) == 1 and found[0].startswith("mixin mixin.py:SplitMixin: inherited by ")
    else:
        assert found == [], found


def test_null_object_check(tmp_path):
    name = "archfixture_nulls"
    base = """
        from abc import ABC, abstractmethod


        class BaseSync(ABC):
            @abstractmethod
            def agree(self, value): ...


        class NoSync(BaseSync):
            def agree(self, value):
                return value


        class Node:  # "No" and a lowercase letter: not a null object
            pass
    """
    write_package(
        tmp_path,
        name,
        {
            "base": base,
            "real": f"""
                from {name} import base
                from {name}.base import Node, NoSync


                class TPSync(NoSync):  # forgets an override: inherits the no-op
                    pass


                class DPSync(base.NoSync):
                    pass


                class Typed(base.NoSync[int]):
                    pass


                class Leaf(Node):
                    pass
            """,
        },
    )
    assert null_object_subclasses(tmp_path / name) == [
        "real.py:6: class TPSync(NoSync)",
        "real.py:10: class DPSync(NoSync)",
        "real.py:14: class Typed(NoSync)",
    ]

    write_package(
        tmp_path,
        name,
        {
            "real": f"""
                from {name}.base import BaseSync, Node


                class TPSync(BaseSync):  # the interface, side by side with NoSync
                    def agree(self, value):
                        return value


                class Leaf(Node):
                    pass
            """,
        },
    )
    assert null_object_subclasses(tmp_path / name) == []


def test_private_import_finder_sees_them(tmp_path):
    name = "archfixture_private"
    write_package(
        tmp_path,
        name,
        {
            "server": "",
            "a": f"""
                from {name}.server import _helper, public
                from {name}.other import _fine  # not under the prefix
                from {name}.server import __version__
            """,
        },
    )
    assert private_imports(tmp_path / name, f"{name}.server") == [
        f"a.py:2: from {name}.server import _helper"
    ]
    write_package(tmp_path, name, {"a": f"from {name}.server import public\n"})
    assert private_imports(tmp_path / name, f"{name}.server") == []
