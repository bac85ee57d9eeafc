"""The soak's verdicts and figures: each check kept or failed, counts by kind and status,
disconnects, latencies, the server's state after the load, the greedy replay; and their text."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter

from radixlm.bench.soak.checks import json_control_chars, output_problems
from radixlm.bench.soak.client import SoakResult
from radixlm.bench.soak.config import SoakConfig
from radixlm.bench.soak.workload import SoakRequest


@dataclasses.dataclass
class AfterLoad:
    """What the server showed once the load was over (drain, flush, quiet replay)."""

    greedy: list[int]  # the greedy requests answered under load, replayed alone
    leaks: list[str] = dataclasses.field(default_factory=lambda: ["not checked"])  # after the load
    leaks_end: list[str] = dataclasses.field(
        default_factory=lambda: ["not checked"]
    )  # after the replay
    state: dict = dataclasses.field(default_factory=dict)  # internal_state once drained
    drain_s: float = 0.0
    flush_ok: bool = False
    mismatches: list[dict] = dataclasses.field(
        default_factory=list
    )  # replays unlike their answer under load
    replay_s: float = 0.0
    post_error: str | None = None  # the server failed after the load


@dataclasses.dataclass
class SoakRun:
    """Everything one soak gathered."""

    cfg: SoakConfig
    reqs: list[SoakRequest]
    results: dict[int, SoakResult]  # by request index
    pool: int  # KV tokens
    load: float  # offered load, KV tokens
    stats0: dict  # internal_state before the load
    duration: float  # seconds of the load
    after: AfterLoad
    health: int | None  # /health's status at the end
    alive: bool
    # failed requests a side load's checks account for (e.g. in flight on a frozen worker)
    excused: set[int] = dataclasses.field(default_factory=set)


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


def summarize(run: SoakRun) -> dict:
    """The checks and figures of a run (summary["ok"]: every check passed; "_results": the
    SoakResults)."""
    cfg, reqs, results, pool, load, stats0, duration = (
        run.cfg,
        run.reqs,
        run.results,
        run.pool,
        run.load,
        run.stats0,
        run.duration,
    )
    a, health, alive = run.after, run.health, run.alive
    greedy, leaks, leaks_end, after_load, drain_s = (
        a.greedy,
        a.leaks,
        a.leaks_end,
        a.state,
        a.drain_s,
    )
    flush_ok, mismatches, replay_s, post_error = a.flush_ok, a.mismatches, a.replay_s, a.post_error
    by_idx = {q.idx: q for q in reqs}
    res = [results[q.idx] for q in reqs]
    counted = [r for r in res if r.idx not in run.excused]
    bad_status = [r for r in counted if not r.disconnected and r.status not in cfg.allowed_statuses]
    fivexx = [r for r in counted if isinstance(r.status, int) and r.status >= 500]
    hangs = [r for r in res if r.status == "hang" or r.latency > cfg.request_timeout]
    output_bad = {
        r.idx: p
        for r in res
        if r.status == 200 and not r.disconnected
        for p in [output_problems(by_idx[r.idx], r)]
        if p
    }
    answered = [r.latency for r in res if r.status == 200]
    prompt_tokens = [r.prompt_tokens for r in res if r.prompt_tokens]
    by_kind: dict[str, Counter] = {}
    for r in res:
        by_kind.setdefault(r.kind, Counter())[str(r.status)] += 1
    features = Counter(f for q in reqs for f in q.features())
    checks = {
        "status": not bad_status,
        "no_5xx": not fivexx,
        "no_hangs": not hangs,
        "outputs": not output_bad,
        "alive": alive,
        "no_leaks": not leaks and not leaks_end,
        "flush": flush_ok,
        "greedy_equal": not mismatches and post_error is None,
    }
    summary = {
        "ok": all(checks.values()),
        "checks": checks,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items()},
        "pool_tokens": pool,
        "offered_load_tokens": round(load),
        "offered_load_ratio": round(load / pool, 2),
        "mean_prompt_tokens_est": round(statistics.mean(q.est_prompt_tokens for q in reqs), 1),
        "mean_prompt_tokens_served": (
            round(statistics.mean(prompt_tokens), 1) if prompt_tokens else None
        ),
        "requests": len(res),
        "by_kind_status": {k: dict(v) for k, v in sorted(by_kind.items())},
        "by_status": dict(Counter(str(r.status) for r in res)),
        "features": dict(sorted(features.items())),
        "planned_disconnects": sum(q.disconnect is not None for q in reqs),
        "disconnects": sum(r.disconnected for r in res),
        "disconnect_phases": dict(Counter(r.disconnect_phase for r in res if r.disconnected)),
        "disconnect_modes": dict(
            Counter(
                f"{by_idx[r.idx].disconnect}:{r.disconnect_phase}" for r in res if r.disconnected
            )
        ),
        "latency_p50_s": _pct(answered, 50),
        "latency_p99_s": _pct(answered, 99),
        "latency_max_s": max(answered, default=None),
        "latency_max_all_s": max((r.latency for r in res), default=None),
        "duration_s": round(duration, 1),
        "requests_per_s": round(len(res) / duration, 2),
        "excused": sorted(run.excused),
        "bad_status": [
            {"idx": r.idx, "kind": r.kind, "status": r.status, "error": r.error} for r in bad_status
        ][:20],
        "hangs": [r.idx for r in hangs],
        "output_problems": {str(k): v for k, v in list(output_bad.items())[:20]},
        "num_output_problems": len(output_bad),
        "json_control_chars": sum(
            json_control_chars(by_idx[r.idx], r)
            for r in res
            if r.status == 200 and not r.disconnected
        ),
        "leaks_after_load": leaks,
        "leaks_after_replay": leaks_end,
        "drain_s": round(drain_s, 1),
        "state_after_load": {
            k: after_load.get(k)
            for k in (
                "max_total_num_tokens",
                "available_kv_tokens",
                "evictable_tokens",
                "protected_tokens",
                "req_slots_total",
                "req_slots_free",
                "num_running",
                "num_waiting",
            )
        },
        "num_retracted": after_load.get("num_retracted", 0) - stats0.get("num_retracted", 0),
        "cache_hit_rate": after_load.get("cache_hit_rate"),
        "flush_ok": flush_ok,
        "post_load_error": post_error,
        "health": health,
        "greedy_replayed": len(greedy) if cfg.replay else 0,
        "greedy_matches": len(greedy) - len(mismatches) if cfg.replay else 0,
        "greedy_mismatches": len(mismatches),
        "mismatches": mismatches[:10],
        "replay_s": round(replay_s, 1),
    }
    summary["_results"] = res
    return summary


def format_summary(s: dict) -> str:
    lines = [
        (
            f"requests {s['requests']} in {s['duration_s']} s ({s['requests_per_s']}/s); "
            f"pool {s['pool_tokens']} KV tokens, "
            f"offered load {s['offered_load_tokens']} ({s['offered_load_ratio']}x); mean prompt "
            f"{s['mean_prompt_tokens_est']} tokens (served: {s['mean_prompt_tokens_served']})"
        ),
        "by kind and status: " + "; ".join(f"{k} {v}" for k, v in s["by_kind_status"].items()),
        f"by status: {s['by_status']}",
        f"features: {s['features']}",
        (
            f"disconnects {s['disconnects']} (planned {s['planned_disconnects']}):"
            f" {s['disconnect_phases']}; by mode: {s['disconnect_modes']}"
        ),
        (
            "latency of answered requests: p50 {} s, p99 {} s, max {} s;"
            " longest request of all {} s"
        ).format(
            *(
                None if x is None else round(x, 2)
                for x in (
                    s["latency_p50_s"],
                    s["latency_p99_s"],
                    s["latency_max_s"],
                    s["latency_max_all_s"],
                )
            )
        ),
        f"retractions {s['num_retracted']}, cache hit rate {s['cache_hit_rate']}",
        (
            f"after the load (drained in {s['drain_s']} s): {s['state_after_load']}; leaks"
            f" {s['leaks_after_load'] or 'none'}; after the replay:"
            f" {s['leaks_after_replay'] or 'none'}; flush ok {s['flush_ok']}; /health {s['health']}"
        ),
        (
            f"greedy replayed {s['greedy_replayed']} in {s['replay_s']} s: {s['greedy_matches']}"
            f" equal, {s['greedy_mismatches']} different"
        ),
    ]
    if s["post_load_error"]:
        lines.append(f"the server failed after the load: {s['post_load_error']}")
    if s["bad_status"]:
        lines.append(f"bad statuses: {s['bad_status']}")
    if s["json_control_chars"]:
        lines.append(
            "JSON outputs with raw control characters in a string (xgrammar, mlc-ai/xgrammar#800):"
            f" {s['json_control_chars']}"
        )
    if s["output_problems"]:
        lines.append(f"output problems ({s['num_output_problems']}): {s['output_problems']}")
    for m in s["mismatches"]:
        lines.append(f"mismatch: {json.dumps(m)[:600]}")
    if "chaos" in s:
        lines.append("chaos: " + json.dumps({k: v for k, v in s["chaos"].items() if k != "checks"}))
    if "fleet" in s:
        lines.append("fleet: " + json.dumps(s["fleet"]))
    if "hostile" in s:
        lines.append(
            "hostile: " + json.dumps({k: v for k, v in s["hostile"].items() if k != "checks"})
        )
    lines += [f"check {k}: {'ok' if v else 'FAILED'}" for k, v in s["checks"].items()]
    lines.append("SOAK OK" if s["ok"] else "SOAK FAILED")
    return "\n".join(lines)
