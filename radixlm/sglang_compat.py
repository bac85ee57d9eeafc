"""SGLang's flags on radixlm's command line (the table is radixlm/sglang_flags.yaml, loaded by
radixlm/sglang_flags.py).

`install_sglang_flags(parser)` gives every (sub)parser that takes ServerArgs the rest of SGLang's
flags, parsed as SGLang parses them, and SGLang's spellings of radixlm's own values;
`check_sglang_flags(args)` then refuses what the table refuses (one line, a FlagRefused), renames
SGLang's values to radixlm's and logs one line per inert flag given."""

from __future__ import annotations

import argparse
import logging
import re

from radixlm.sglang_flags import (
    GROUPS,
    SWITCH_ALIASES,
    VALUE_RULES,
    FlagGroup,
    FlagSpec,
    Kind,
    normalize_values,
    refusal,
)

logger = logging.getLogger(__name__)

_DEST = "sglang:"  # namespace attributes of table flags: never a ServerArgs field
# SGLang parses these with human_readable_int ("32k", "1Mi").
HUMAN_READABLE_INTS = ("context_length", "max_total_tokens", "max_prefill_tokens")
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(text: str) -> int:
    """An int, or SGLang's suffixed form: SI k M G T (decimals allowed), IEC Ki Mi Gi Ti."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text.strip())
    if not m:
        return int(text)
    number, suffix = m.groups()
    if suffix in _IEC:
        if "." in number:
            raise argparse.ArgumentTypeError(f"decimals are not allowed with {suffix}: {text!r}")
        return int(number) * _IEC[suffix]
    return int(float(number) * _SI[suffix])


def server_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """parser and its subparsers, at any depth, that take ServerArgs' options."""
    out, todo = [], [parser]
    while todo:
        p = todo.pop()
        if "--model-path" in p._option_string_actions:
            out.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return out


def _add_table_flag(p: argparse.ArgumentParser, group: FlagGroup, spec: FlagSpec) -> None:
    options = [o for o in spec.options if o not in p._option_string_actions]
    if not options:  # radixlm has it now (another branch added it): its own option wins
        return
    kw: dict = dict(dest=_DEST + spec.name[2:], default=None, help=argparse.SUPPRESS)
    if spec.negatable:
        kw["action"] = argparse.BooleanOptionalAction
    elif spec.nargs == 0:
        kw.update(action="store_const", const=True)
    else:
        kw["nargs"] = spec.nargs
        if spec.nargs == "?":
            kw["const"] = ""
    p.add_argument(*options, **kw)


def install_sglang_flags(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> None:
    """On every parser that takes ServerArgs; with argv, only on the one its subcommand names (the
    ~300 flags cost ~40 ms of start-up per parser)."""
    if argv is not None:
        from radixlm.config_file import command_parser

        parser = command_parser(parser, argv)[0]
    for p in server_parsers(parser):
        for group in GROUPS:
            for spec in group.specs:
                _add_table_flag(p, group, spec)
        if (
            "--model" not in p._option_string_actions
        ):  # SGLang's alias of --model-path (serve and generate have it)
            p.add_argument("--model", dest="model_path", help=argparse.SUPPRESS)
        for flag, dest in SWITCH_ALIASES.items():
            if flag not in p._option_string_actions:
                p.add_argument(flag, dest=dest, action="store_true", help=argparse.SUPPRESS)
        p.add_argument(
            "--config",
            metavar="FILE.yaml",
            help=(
                "options from a YAML file, as SGLang reads it (keys "
                "are flag names; the command line wins); SGLang's other flags: docs/sglang_flags.md"
            ),
        )
        for action in p._actions:
            rule = VALUE_RULES.get(action.dest)
            if rule and action.choices is not None:
                # SGLang's spellings pass argparse; check_sglang_flags renames or refuses them.
                action.metavar = "{" + ",".join((*action.choices, *rule.renamed)) + "}"
                action.choices = (*action.choices, *rule.sglang_values())
            if action.dest in HUMAN_READABLE_INTS:
                action.type = human_readable_int


_TABLE = {_DEST + spec.name[2:]: (group, spec) for group in GROUPS for spec in group.specs}


def check_sglang_flags(args: argparse.Namespace) -> list[str]:
    """Refuse (FlagRefused), rename SGLang's values, log the inert flags given; returns the log
    lines."""
    if not hasattr(args, "model_path"):  # a command without ServerArgs (router, bench serving)
        return []
    given = [
        (dest, value) for dest, value in vars(args).items() if dest in _TABLE and value is not None
    ]
    inert = []
    for dest, value in given:
        group, spec = _TABLE[dest]
        shown = spec.name if spec.nargs == 0 or spec.negatable else f"{spec.name} {_show(value)}"
        if group.kind == Kind.REFUSED:
            if str(value) not in spec.accepted:
                raise refusal(shown, group.why, group.instead)
            inert.append(f"{shown}: accepted (radixlm does this anyway)")
        else:
            inert.append(
                f"{shown} ignored: {group.why}" + (f" ; {group.instead}" if group.instead else "")
            )
    normalize_values(args, cli=True)
    if inert:
        from radixlm.utils import configure_logging

        configure_logging(getattr(args, "log_level", "info") or "info")
        for line in inert:
            logger.warning(line)
    return inert


def _show(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)
