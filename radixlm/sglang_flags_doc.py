"""docs/sglang_flags.md: every SGLang server flag and what radixlm does with it.

The rows are SGLang's parser (sglang/srt/server_args.py of the installed sglang, read with ast:
importing it needs triton); what radixlm does comes from radixlm's own parser and the table
(radixlm/sglang_flags.yaml, loaded by radixlm/sglang_flags.py). Run after changing either:

    python -m radixlm.sglang_flags_doc --write    # regenerate docs/sglang_flags.md
    python -m radixlm.sglang_flags_doc --check    # exit 1 if the checked-in file is stale
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from radixlm.sglang_flags import DIFFERENT, SWITCH_ALIASES, VALUE_RULES, Kind, all_specs

DOC = Path(__file__).resolve().parent.parent / "docs" / "sglang_flags.md"
_SWITCH_ACTIONS = {
    "store_true",
    "DeprecatedAction",
    "DeprecatedStoreTrueAction",
    "BooleanOptionalAction",
}


@dataclass(frozen=True)
class SGLangFlag:
    options: tuple[str, ...]
    nargs: int | str | None  # 0: a switch; None: one value; "+", "*", "?"
    choices: tuple[str, ...] | None  # as strings (a command line's spelling)
    negatable: bool = False
    type_name: str | None = (
        None  # SGLang's `type=` as written (int, float, str, human_readable_int, ...)
    )

    @property
    def name(self) -> str:
        return self.options[0]


class _Names:
    """What names in SGLang's modules stand for, as far as literals go (enough for `choices=`)."""

    def __init__(self, package_dir: Path):
        self.package_dir = package_dir
        self._modules: dict[str, tuple[dict, dict]] = {}

    def module(self, dotted: str) -> tuple[dict, dict]:
        """(assignments and classes by name, imported name -> (module, name)) of one module."""
        if dotted not in self._modules:
            path = self.package_dir.parent.joinpath(*dotted.split(".")).with_suffix(".py")
            tree = ast.parse(path.read_text())
            defs: dict = {}
            imports: dict = {}
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    defs.setdefault(node.targets[0].id, node.value)
                elif (
                    isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name)
                    and node.value
                ):
                    defs.setdefault(node.target.id, node.value)
                elif isinstance(node, ast.ClassDef):
                    defs.setdefault(node.name, node)
                elif (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.module.startswith("sglang")
                ):
                    for alias in node.names:
                        imports[alias.asname or alias.name] = (node.module, alias.name)
            self._modules[dotted] = (defs, imports)
        return self._modules[dotted]

    def value(self, node, module: str):
        defs, imports = self.module(module)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out = []
            for elt in node.elts:
                out += (
                    self.value(elt.value, module)
                    if isinstance(elt, ast.Starred)
                    else [self.value(elt, module)]
                )
            return out
        if isinstance(node, ast.Dict):  # keys only (values are classes, not literals)
            return {self.value(k, module): None for k in node.keys}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return list(self.value(node.left, module)) + list(self.value(node.right, module))
        if isinstance(node, ast.Name):
            if node.id in defs:
                target = defs[node.id]
                return (
                    (target, module)
                    if isinstance(target, ast.ClassDef)
                    else self.value(target, module)
                )
            source, name = imports[node.id]
            return self.value(ast.Name(name), source)
        if isinstance(node, ast.Attribute):  # Class.attribute
            cls, cls_module = self.value(node.value, module)
            for stmt in cls.body:
                targets = (
                    stmt.targets
                    if isinstance(stmt, ast.Assign)
                    else [getattr(stmt, "target", None)]
                )
                if any(isinstance(t, ast.Name) and t.id == node.attr for t in targets):
                    return self.value(stmt.value, cls_module)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
                return list(self.value(node.func.value, module))
            if isinstance(node.func, ast.Name) and node.func.id in ("list", "sorted", "tuple"):
                return list(self.value(node.args[0], module))
        raise ValueError(f"cannot read {ast.unparse(node)!r} in {module}")


def sglang_server_args_path() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        raise FileNotFoundError(
            "sglang is not installed (pip install --no-deps sglang==0.5.10.post1)"
        )
    return Path(spec.origin).parent / "srt" / "server_args.py"


def read_sglang_flags(path: Path | None = None) -> list[SGLangFlag]:
    """SGLang's server flags in its parser's order, with their arity and choices."""
    path = path or sglang_server_args_path()
    names = _Names(path.parent.parent)
    module = "sglang.srt.server_args"
    flags = []  # (line, flag): ast.walk goes breadth first, the table follows the file
    for node in ast.walk(ast.parse(path.read_text())):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        options = tuple(a.value for a in node.args if isinstance(a, ast.Constant))
        kw = {k.arg: k.value for k in node.keywords}
        action = ast.unparse(kw["action"]).strip("'\"").split(".")[-1] if "action" in kw else None
        nargs = kw["nargs"].value if "nargs" in kw else None
        if action in _SWITCH_ACTIONS:
            nargs = 0
        choices = (
            tuple(str(c) for c in names.value(kw["choices"], module)) if "choices" in kw else None
        )
        type_name = ast.unparse(kw["type"]) if "type" in kw else None
        flags.append(
            (
                node.lineno,
                SGLangFlag(options, nargs, choices, action == "BooleanOptionalAction", type_name),
            )
        )
    return [f for _, f in sorted(flags, key=lambda x: x[0])]


def radixlm_parser() -> argparse.ArgumentParser:
    """`radixlm serve`'s options (ServerArgs, --model, SGLang's table flags, --config)."""
    from radixlm.cli import option_choices
    from radixlm.config import ServerArgs
    from radixlm.router.model_front_launch import ModelPathAction, add_multi_model_args
    from radixlm.sglang_compat import install_sglang_flags

    parser = argparse.ArgumentParser(prog="radixlm serve")
    parser.add_argument("--model", dest="model_path_alias", action=ModelPathAction)
    ServerArgs.add_cli_args(parser, option_choices(), actions={"model_path": ModelPathAction})
    add_multi_model_args(parser)
    install_sglang_flags(parser)
    return parser


@dataclass(frozen=True)
class Row:
    flag: SGLangFlag
    kind: Kind | None  # None: radixlm has no entry (a test fails)
    note: str


def classify(flags: list[SGLangFlag], parser: argparse.ArgumentParser) -> list[Row]:
    table = all_specs()
    own = {
        o: a for a in parser._actions for o in a.option_strings if not a.dest.startswith("sglang:")
    }
    rows = []
    for f in flags:
        hit = next((table[o] for o in f.options if o in table), None)
        mine = next((own[o] for o in f.options if o in own), None)
        if hit:
            group, spec = hit
            note = group.why + (f" ; {group.instead}" if group.instead else "")
            if spec.accepted:
                note += (
                    " (accepted: "
                    + ", ".join(f"`{v}`" if v else "`''`" for v in spec.accepted)
                    + ")"
                )
            rows.append(Row(f, group.kind, note))
        elif f.name in SWITCH_ALIASES:
            rows.append(
                Row(
                    f,
                    Kind.SAME,
                    f"SGLang's deprecated spelling of --{SWITCH_ALIASES[f.name].replace('_', '-')}",
                )
            )
        elif mine is not None:
            flag = "--" + mine.dest.replace("_", "-")
            note = next((DIFFERENT[o] for o in (*f.options, flag) if o in DIFFERENT), "")
            rule = VALUE_RULES.get(mine.dest)
            if rule:
                note += "".join(f"; `{a}` is `{b}`" for a, b in rule.renamed.items())
                note += "".join(
                    f"; refused: {', '.join(f'`{v}`' for v in r.values)} ({r.why} ; {r.instead})"
                    for r in rule.refused
                )
            rows.append(Row(f, Kind.DIFFERENT if note else Kind.SAME, note.lstrip("; ")))
        else:
            rows.append(Row(f, None, "no entry"))
    return rows


def render(rows: list[Row], version: str) -> str:
    counts = {k: sum(r.kind == k for r in rows) for k in Kind}
    pending = sum(r.note.startswith("pending") for r in rows)
    out = [
        "# SGLang's server flags in radixlm",
        "",
        (
            "<!-- generated by `python -m radixlm.sglang_flags_doc --write`; edit"
            " radixlm/sglang_flags.py instead -->"
        ),
        "",
        (
            f"Every flag of SGLang {version}'s `launch_server` parser and what `radixlm serve` (and"
            " `radixlm generate`, `radixlm bench offline`) does with it: **same** (SGLang's"
            " meaning), **different** (accepted; how it differs), **inert** (accepted and ignored"
            " here, with one log line saying why) or **refused** (one line at parse time,"
            " `radixlm: error: --flag: why ; what radixlm does instead`, exit 2). SGLang's value"
            " spellings of radixlm's own options are accepted where radixlm has the thing"
            " (`--dtype half`, `--kv-cache-dtype bf16`, `--attention-backend torch_native`,"
            " `--speculative-algorithm NGRAM`) and refused with the reason where it does not."
            " `--config FILE.yaml` reads a YAML file of these flags as SGLang does (the command"
            " line wins)."
        ),
        "",
        f"{len(rows)} flags: "
        + ", ".join(f"{counts[k]} {k.value}" for k in Kind)
        + (f" ({pending} of the refused pending other parts of issue 49)" if pending else "")
        + ".",
        "",
        "| SGLang flag | radixlm | how / why |",
        "|---|---|---|",
    ]
    for r in rows:
        kind = r.kind.value if r.kind else "**missing**"
        out.append(f"| `{' / '.join(r.flag.options)}` | {kind} | {r.note.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def generate() -> str:
    from importlib.metadata import version

    return render(classify(read_sglang_flags(), radixlm_parser()), version("sglang"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m radixlm.sglang_flags_doc")
    ap.add_argument("--write", action="store_true", help=f"write {DOC}")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the file differs from what the code generates",
    )
    args = ap.parse_args(argv)
    text = generate()
    if args.write:
        DOC.write_text(text)
    elif args.check:
        return 0 if DOC.exists() and DOC.read_text() == text else 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
