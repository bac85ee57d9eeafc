"""`--config FILE.yaml`, as SGLang reads it (sglang/srt/server_args_config_parser.py).

The file is a YAML mapping of flag names (`model-path: ...`; radixlm also takes `model_path`) to
values. It becomes command-line arguments placed before the ones typed, so the command line wins
(command line > file > defaults): a switch is given when true (false leaves it off; a --[no-]x
switch gets --no-x), a list is the flag's values, anything else its string; null (radixlm only)
keeps the default. One file at most; its name must end in .yaml or .yml."""

from __future__ import annotations

import argparse
from pathlib import Path

_SWITCHES = (argparse._StoreTrueAction, argparse._StoreConstAction)


def command_parser(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.ArgumentParser, int]:
    """The (sub)parser argv's leading subcommand names select, and how many names there are."""
    depth = 0
    while depth < len(argv):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or argv[depth] not in subs[0].choices:
            break
        parser = subs[0].choices[argv[depth]]
        depth += 1
    return parser, depth


def _config_path(argv: list[str]) -> tuple[str | None, list[str]]:
    """The file named by --config (or --config=FILE) and argv without it."""
    found, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 == len(argv):
                raise ValueError("--config: no file given")
            found.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--config="):
            found.append(argv[i].split("=", 1)[1])
        else:
            rest.append(argv[i])
        i += 1
    if len(found) > 1:
        raise ValueError("--config: give one config file, not several")
    return (found[0] if found else None), rest


def read_config_file(path: str) -> dict:
    import yaml

    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"--config: the file must be YAML (.yaml or .yml), got {path!r}")
    if not p.is_file():
        raise ValueError(f"--config: no such file: {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: the file must hold a mapping of option names to values")
    return data


def _as_argv(parser: argparse.ArgumentParser, data: dict, path: str) -> list[str]:
    argv: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        action = parser._option_string_actions.get(flag)
        if action is None:
            raise ValueError(f"--config {path}: unknown option {key!r}")
        if value is None:
            continue
        if isinstance(value, bool) and isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, bool) and isinstance(action, _SWITCHES):
            argv += [flag] if value else []
        elif isinstance(value, list):
            argv += [flag, *map(str, value)] if value else []
        elif isinstance(value, bool):
            argv += [flag, str(value).lower()]
        else:
            argv += [flag, str(value)]
    return argv


def expand_config_file(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with --config FILE replaced by the file's options, placed before the typed ones."""
    path, rest = _config_path(argv)
    if path is None:
        return argv
    command, depth = command_parser(parser, rest)
    return rest[:depth] + _as_argv(command, read_config_file(path), path) + rest[depth:]
