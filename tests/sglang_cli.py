"""Helpers for the SGLang-flag tests: `radixlm serve` through cli.main, stopped before anything
starts, and the parser cli.main builds for it (for tests that parse hundreds of command lines)."""

from __future__ import annotations

import pytest

import radixlm.cli as cli
from radixlm.config import ServerArgs
from radixlm.engine.launcher import check_server_args


def run_cli(argv, monkeypatch, capsys, command="serve", check=False):
    """cli.main([command, *argv]) with the command replaced by one that builds ServerArgs (check:
    and the
    engine's configs, resolving their dtypes): (exit code, stderr's lines, ServerArgs, the
    Namespace).
    """
    seen = {}

    def fake(args):
        seen["ns"] = args
        seen["args"] = sa = ServerArgs.from_cli_args(args)
        if check:
            runner = check_server_args(sa).runner
            seen["dtypes"] = (runner.resolved_dtype(), runner.resolved_kv_cache_dtype())
        return 0

    monkeypatch.setattr(cli, "cmd_serve" if command == "serve" else "cmd_generate", fake)
    try:
        rc = cli.main([command, *argv])
    except (
        SystemExit
    ) as e:  # argparse's own errors (usage + message): never expected by these tests
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, [line for line in err.splitlines() if line.strip()], seen.get("args"), seen


def serve_parser_of_main():
    """The `serve` subparser cli.main builds (with SGLang's flags installed)."""
    import radixlm.sglang_compat as compat

    mp = pytest.MonkeyPatch()
    captured = []
    real = compat.install_sglang_flags

    def capture(parser, argv=None):
        real(parser, argv)
        captured.append(parser)

    mp.setattr(compat, "install_sglang_flags", capture)
    mp.setattr(cli, "cmd_serve", lambda args: 0)
    try:
        cli.main(["serve"])
    finally:
        mp.undo()
    return captured[0]._subparsers._group_actions[0].choices["serve"]


def parse(parser, argv, check=False):
    """What cli.main does with a `serve` command line after building its parser: (exit code, the
    error line or None, ServerArgs or None). An argparse error raises SystemExit (never expected
    here)."""
    from radixlm.sglang_compat import check_sglang_flags

    args = parser.parse_args(argv)
    try:
        check_sglang_flags(args)
        sa = ServerArgs.from_cli_args(args)
        if check:
            runner = check_server_args(sa).runner
            runner.resolved_dtype(), runner.resolved_kv_cache_dtype()
    except ValueError as e:
        return 2, f"radixlm: error: {e}", None
    return 0, None, sa
