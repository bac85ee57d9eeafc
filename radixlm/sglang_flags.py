"""SGLang's server flags that radixlm does not take with SGLang's meaning (a leaf: the table's
types, its loading and small helpers). The table itself is data: sglang_flags.yaml, beside this
module, read once at import.

A flag that is a ServerArgs field is "same" unless DIFFERENT lists it; every other SGLang flag is in
one of the GROUPS: inert (accepted, one log line saying why it does nothing here) or refused (a
parse-time error: `radixlm: error: --flag: why ; what radixlm does instead`). VALUE_RULES give
SGLang's value spellings of radixlm's own options: renamed to radixlm's, or refused with a reason.
COMBINATIONS (code: a test on the parsed options) are below. docs/sglang_flags.md is generated from
the table (python -m radixlm.sglang_flags_doc --write).

A flag's spelling says how it parses, as SGLang's parser does: "--a" a switch, "--a V" one value,
"--a V..." one or more, "--a [V...]" any number, "--a [V]" an optional value; aliases joined by
"/"; "--[no-]a" a switch with its negation; "V=x,y" (refused groups only): these values are
accepted (what radixlm does anyway) and only the others refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from typing import Any

import yaml


class Kind(str, Enum):
    SAME = "same"  # a ServerArgs field with SGLang's meaning
    DIFFERENT = "different"  # accepted; meaning or values differ (DIFFERENT / VALUE_RULES say how)
    INERT = "inert"  # accepted and ignored on this machine, with one log line
    REFUSED = "refused"  # a one-line error at parse time


@dataclass(frozen=True)
class FlagSpec:
    options: tuple[str, ...]  # the option strings (aliases), SGLang's first
    nargs: str | None  # argparse's: None one value, "+", "*", "?"; 0 for a switch
    accepted: tuple[str, ...] = ()  # values accepted by a refused flag (radixlm's own behaviour)
    negatable: bool = False  # also --no-<name> (argparse.BooleanOptionalAction)

    @property
    def name(self) -> str:
        return self.options[0]

    @staticmethod
    def parse(spelling: str) -> FlagSpec:
        opts, _, arg = spelling.partition(" ")
        negatable = opts.startswith("--[no-]")
        options = tuple(("--" + opts[7:]) if negatable else o for o in opts.split("/"))
        arg, _, accepted = arg.partition("=")
        nargs = {"": 0, "V": None, "V...": "+", "[V...]": "*", "[V]": "?"}[arg]
        return FlagSpec(options, nargs, tuple(accepted.split(",")) if accepted else (), negatable)


@dataclass(frozen=True)
class FlagGroup:
    kind: Kind
    why: str  # why radixlm ignores or refuses these
    instead: str  # what radixlm does instead
    flags: tuple[str, ...]  # spellings (see the module docstring)
    specs: tuple[FlagSpec, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "specs", tuple(FlagSpec.parse(s) for s in self.flags))


@dataclass(frozen=True)
class RefusedValues:
    values: tuple[str, ...]
    why: str
    instead: str


@dataclass(frozen=True)
class ValueRule:
    """SGLang's spellings of one radixlm option's values."""

    flag: str
    renamed: Mapping[str, str] = field(default_factory=dict)  # SGLang's value -> radixlm's
    refused: tuple[RefusedValues, ...] = ()

    def sglang_values(self) -> tuple[str, ...]:
        return tuple(self.renamed) + tuple(v for r in self.refused for v in r.values)


def _load_table() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("sglang_flags.yaml").read_text(encoding="utf-8")
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _value_rule(rule: dict[str, Any]) -> ValueRule:
    refused = tuple(
        RefusedValues(**{**r, "values": tuple(r["values"])}) for r in rule.get("refused", ())
    )
    return ValueRule(**{**rule, "refused": refused})


def _group(group: dict[str, Any]) -> FlagGroup:
    return FlagGroup(
        **{"instead": "", **group, "kind": Kind(group["kind"]), "flags": tuple(group["flags"])}
    )


_TABLE = _load_table()
SGLANG_VERSION: str = _TABLE["sglang_version"]  # the parser the table was written against
VALUE_RULES: dict[str, ValueRule] = {k: _value_rule(v) for k, v in _TABLE["value_rules"].items()}
# ServerArgs fields whose meaning differs from SGLang's (VALUE_RULES' renames and refusals come on
# top).
DIFFERENT: dict[str, str] = _TABLE["different"]
# SGLang's deprecated spellings of radixlm switches (same meaning).
SWITCH_ALIASES: dict[str, str] = _TABLE["switch_aliases"]
GROUPS: tuple[FlagGroup, ...] = tuple(_group(g) for g in _TABLE["groups"])


@dataclass(frozen=True)
class FlagCombination:
    """Accepted flags that radixlm refuses together (SGLang may take them, or assert later)."""

    flag: str  # the flag the one-line error names
    refuses: Callable[[Any], bool]  # on the parsed namespace
    why: str
    instead: str


def _dp_attention_sizes_differ(args: Any) -> bool:
    # SGLang asserts tp_size % dp_size == 0 when the server starts; radixlm also needs them equal.
    # (--dp-size 1 turns DP attention off, as in SGLang.)
    dp = getattr(args, "dp_size", 1) or 1
    return (
        bool(getattr(args, "enable_dp_attention", False))
        and dp > 1
        and getattr(args, "tp_size", 1) != dp
    )


COMBINATIONS: tuple[FlagCombination, ...] = (
    FlagCombination(
        "--enable-dp-attention",
        _dp_attention_sizes_differ,
        "DP attention needs --tp-size equal to --dp-size (one rank per attention group; radixlm"
        " does not split a group's heads over ranks)",
        "--tp-size N --dp-size N (N >= 2) on a MoE model",
    ),
)


def all_specs() -> dict[str, tuple[FlagGroup, FlagSpec]]:
    """Every option string of the table -> its group and spec."""
    out: dict[str, tuple[FlagGroup, FlagSpec]] = {}
    for group in GROUPS:
        for spec in group.specs:
            for option in spec.options:
                out[option] = (group, spec)
    return out


class FlagRefused(ValueError):
    """A refused SGLang flag or value: its one-line reason."""


def refusal(flag: str, why: str, instead: str) -> FlagRefused:
    return FlagRefused(f"{flag}: {why} ; {instead}")


def normalize_values(obj, cli: bool = False) -> None:
    """SGLang's spellings of radixlm options on `obj` (ServerArgs or a parsed Namespace): renamed to
    radixlm's in place, or a FlagRefused naming the flag (cli) or the field."""
    for name, rule in VALUE_RULES.items():
        value = getattr(obj, name, None)
        if value is None:
            continue
        if value in rule.renamed:
            setattr(obj, name, rule.renamed[value])
            continue
        for r in rule.refused:
            if value in r.values:
                raise refusal(
                    f"{rule.flag} {value}" if cli else f"{name}={value!r}", r.why, r.instead
                )
    for combo in COMBINATIONS:
        if combo.refuses(obj):
            raise refusal(
                combo.flag if cli else combo.flag.lstrip("-").replace("-", "_"),
                combo.why,
                combo.instead,
            )
