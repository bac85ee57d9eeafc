"""The architecture as tests: the import contracts of pyproject.toml ([tool.importlinter]: the
layers, the leaves, the independent router, no cycle between siblings), no import cycle between
modules, no module past 500 lines and no class past 400 (radixlm/ only). TYPE_CHECKING and lazy
(function-level) imports count like any other: a cycle through them is still a cycle to untangle.

Each checker also runs on a small package written to a temp dir, with and without the fault it looks
for, so that a pass means the fault is absent, not that the checker is blind.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
from collections import deque
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "radixlm"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 400
# Generated tables exempt from the size limits (paths relative to radixlm/); none today.
GENERATED: frozenset[str] = frozenset()


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


def oversized(package_dir: Path, exempt: frozenset[str] = frozenset()) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and classes over MAX_CLASS_LINES (decorators
    included)."""
    out = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if rel in exempt:
            continue
        src = path.read_text()
        n = len(src.splitlines())
        if n > MAX_MODULE_LINES:
            out.append(f"module {rel}: {n} lines (max {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(src, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                size = node.end_lineno - first + 1
                if size > MAX_CLASS_LINES:
                    out.append(f"class {rel}:{node.name}: {size} lines (max {MAX_CLASS_LINES})")
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


# ----------------------------------------------------------------------------- the checkers checked
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
