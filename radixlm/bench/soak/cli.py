"""Soak: many mixed requests against a KV pool far too small for the offered load, with clients
disconnecting at random moments; then checks that nothing failed, hung, died or leaked, and that
greedy outputs equal a quiet run's (docs/reliability.md, "Soak").

    python benchmarks/soak.py --server-args "--max-total-tokens 3000 --enable-invariant-checks"
    python benchmarks/soak.py --url http://127.0.0.1:30000
    python benchmarks/soak.py --fleet --hostile --server-args "--model-path M --quantization q8_0"

The workload and the checks: radixlm/bench/soak/__init__.py. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time

from radixlm.bench.soak.config import SoakConfig
from radixlm.bench.soak.fleet import FleetConfig, run_fleet
from radixlm.bench.soak.hostile import HostileConfig, HostileLoad
from radixlm.bench.soak.report import format_summary
from radixlm.bench.soak.runner import run


def _range(s: str) -> tuple[int, int]:
    lo, _, hi = s.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"need LO,HI with 0 < LO <= HI, got {s!r}")
    return lo, hi


def parser() -> argparse.ArgumentParser:
    d = SoakConfig()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server")
    where.add_argument(
        "--server-args",
        help=(
            "start `radixlm serve` with these arguments (one string; write "
            "--server-args=--flag when it is a single flag)"
        ),
    )
    p.add_argument("--num-requests", type=int, default=d.num_requests)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--disconnect-rate", type=float, default=d.disconnect_rate)
    p.add_argument(
        "--disconnect-max-delay",
        type=float,
        default=d.disconnect_max_delay,
        help=(
            "seconds: timed disconnects happen within this (default: 1.5x the median latency so"
            " far)"
        ),
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout,
        help="the hang bound: seconds within which every request must end",
    )
    p.add_argument("--max-new-tokens", type=_range, default=d.max_new_tokens, metavar="LO,HI")
    p.add_argument(
        "--short-words",
        type=_range,
        default=d.short_words,
        metavar="LO,HI",
        help="short prompts' sizes in words (about a token each)",
    )
    p.add_argument(
        "--long-words",
        type=_range,
        default=d.long_words,
        metavar="LO,HI",
        help="long prompts' sizes in words; they share prefixes of --num-docs documents",
    )
    p.add_argument("--long-fraction", type=float, default=d.long_fraction)
    p.add_argument("--num-docs", type=int, default=d.num_docs)
    p.add_argument("--greedy-fraction", type=float, default=d.greedy_fraction)
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout)
    p.add_argument(
        "--no-replay", action="store_true", help="skip the quiet replay of greedy requests"
    )
    p.add_argument(
        "--hostile",
        action="store_true",
        help=(
            "attackers alongside the load (ReDoS, fan-out, template bombs, slow loris; hostile.py)"
        ),
    )
    p.add_argument(
        "--forge-dir",
        help="with --hostile: the server's --hicache-storage-dir, whose files get forged",
    )
    f = p.add_argument_group(
        "fleet",
        "--fleet: a Mooncake master, two workers sharing it (each started with --server-args),"
        " sglang-router over them; the load goes through the router while worker 1's scheduler is"
        " frozen and then the master killed (fleet.py, chaos.py)",
    )
    f.add_argument("--fleet", action="store_true")
    fd = FleetConfig([])
    f.add_argument(
        "--watchdog-timeout",
        type=float,
        default=fd.watchdog_timeout,
        help=(
            "the workers' (s); above the longest loop step (a first constrained request loads the"
            " scheduler's tokenizer and grammar backend: ~2.5 s on a busy 2-core machine)"
        ),
    )
    f.add_argument(
        "--no-restart-on-failure",
        action="store_true",
        help="the frozen worker exits instead of starting a new engine",
    )
    f.add_argument("--freeze-at", type=float, default=fd.freeze_at, help="seconds into the load")
    f.add_argument(
        "--kill-master-at",
        type=float,
        default=fd.kill_master_at,
        help="seconds into the load (not before the frozen worker is back)",
    )
    p.add_argument("--output", help="write the JSON summary here")
    p.add_argument("--requests-output", help="write one JSON line per request here")
    return p


def config_from_args(a: argparse.Namespace) -> SoakConfig:
    return SoakConfig(
        num_requests=a.num_requests,
        concurrency=a.concurrency,
        seed=a.seed,
        disconnect_rate=a.disconnect_rate,
        disconnect_max_delay=a.disconnect_max_delay,
        request_timeout=a.request_timeout,
        max_new_tokens=a.max_new_tokens,
        short_words=a.short_words,
        long_words=a.long_words,
        long_fraction=a.long_fraction,
        num_docs=a.num_docs,
        greedy_fraction=a.greedy_fraction,
        drain_timeout=a.drain_timeout,
        replay=not a.no_replay,
    )


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    cfg = config_from_args(a)
    t0 = time.time()
    hostile = HostileConfig(forge_dir=a.forge_dir, seed=a.seed) if a.hostile else None
    server_args = shlex.split(a.server_args) if a.server_args else None
    if a.fleet:
        if server_args is None:
            raise SystemExit("--fleet starts its workers: give --server-args, not --url")
        fleet = FleetConfig(
            server_args,
            watchdog_timeout=a.watchdog_timeout,
            restart_on_failure=not a.no_restart_on_failure,
            freeze_at=a.freeze_at,
            kill_master_at=a.kill_master_at,
        )
        summary = run_fleet(cfg, fleet, hostile)
    else:
        summary = run(a.url, cfg, server_args, side=[HostileLoad(hostile)] if hostile else [])
    results = summary.pop("_results")
    summary["command"] = " ".join(
        shlex.quote(x) for x in (sys.argv if argv is None else ["soak.py", *argv])
    )
    summary["wall_s"] = round(time.time() - t0, 1)
    print(format_summary(summary))
    if summary.get("server_log_tail"):
        print("server log (tail):\n" + summary["server_log_tail"])
    if a.output:
        with open(a.output, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    if a.requests_output:
        with open(a.requests_output, "w") as f:
            for r in results:
                f.write(json.dumps(dataclasses.asdict(r), default=str) + "\n")
    return 0 if summary["ok"] else 1
