"""What one /dashboard/stream tick carries: rates, latency percentiles, the scheduler's gauges,
the recent requests and the radix tree, built from a DashboardSnapshotReqOutput (one control call)
and the recent-requests ring. Pure functions plus the per-connection counters that turn the
scheduler's running totals into rates."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.engine.recent_requests import RecentRequest

LATENCY_WINDOW_S = 60.0  # TTFT / ITL percentiles over the requests finished this recently
RECENT_SHOWN = 50


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation (numpy's default); None for no
    values."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def latency_percentiles(recent: list[RecentRequest], now: float) -> dict[str, float | None]:
    window = [r for r in recent if now - r.finished_at <= LATENCY_WINDOW_S]
    ttft = [r.ttft for r in window if r.ttft is not None]
    itl = [r.itl for r in window if r.itl is not None]
    out: dict[str, float | None] = {}
    for q in (50, 90, 99):
        out[f"ttft_p{q}"] = percentile(ttft, q)
        out[f"itl_p{q}"] = percentile(itl, q)
    return out


# Running totals of the scheduler turned into per-second rates: (name in the feed, where it is).
_RATE_SOURCES: dict[str, Callable[[dict], float]] = {
    "output_tok_s": lambda s: s.get("generated_tokens", 0),
    "prompt_tok_s": lambda s: s.get("prompt_tokens", 0),
    "l2_hit_tok_s": lambda s: (s.get("hicache") or {}).get("l2_hit_tokens", 0),
    "l3_hit_tok_s": lambda s: (s.get("hicache") or {}).get("l3_hit_tokens", 0),
}


@dataclass
class FeedRates:
    """One connection's previous totals (each client gets rates since its own last tick)."""

    last: tuple[float, dict[str, float]] | None = None
    _clock: Callable[[], float] = field(default=time.monotonic)

    def update(self, state: dict) -> dict[str, float | None]:
        now, totals = self._clock(), {k: float(f(state)) for k, f in _RATE_SOURCES.items()}
        prev, self.last = self.last, (now, totals)
        if prev is None or now <= prev[0]:
            return {k: None for k in totals}
        dt = now - prev[0]
        # A total that went down was reset (/flush_cache resets the prompt counters): no rate this
        # tick.
        return {k: (v - prev[1][k]) / dt if v >= prev[1][k] else None for k, v in totals.items()}


def gauges(state: dict) -> dict[str, Any]:
    total = state["max_total_num_tokens"]
    free, evictable = state["available_kv_tokens"], state["evictable_tokens"]
    running_kv = total - free - evictable  # held by running requests
    hc = state.get("hicache")
    return {
        "num_running": state["num_running"],
        "num_waiting": state["num_waiting"],
        "num_retracted": state.get("num_retracted", 0),
        "kv_usage": running_kv / total if total else 0.0,
        "kv_cached": evictable / total if total else 0.0,  # held by the tree alone (evictable)
        "max_total_num_tokens": total,
        "cache_hit_rate": state.get("cache_hit_rate", 0.0),
        "spec_accept_length": state.get("spec_accept_length"),
        "hicache": (
            None
            if not hc
            else {
                k: hc.get(k)
                for k in ("l2_hit_tokens", "l3_hit_tokens", "l2_used_tokens", "l3_bytes")
            }
        ),
        "dashboard_snapshots": state.get("dashboard_snapshots", 0),
    }


def tree_nodes(nodes: list[dict], decode: Callable[[list[int]], str] | None) -> list[dict]:
    """The scheduler's nodes for the page; with decode (--dashboard-show-text) each gets its
    text."""
    out = []
    for n in nodes:
        ids = n.get("token_ids")
        n = {k: v for k, v in n.items() if k != "token_ids"}
        if decode is not None and ids is not None:
            n["text"] = decode(ids)
        out.append(n)
    return out


def build_event(
    snapshot,
    recent_items: list[RecentRequest],
    finished_total: int,
    rates: FeedRates,
    model: str,
    decode: Callable[[list[int]], str] | None,
) -> dict:
    now = time.time()
    show_text = decode is not None
    return {
        "t": now,
        "model": model,
        "show_text": show_text,
        "rates": rates.update(snapshot.state),
        "latency": latency_percentiles(recent_items, now),
        "state": gauges(snapshot.state),
        "recent": [r.as_dict(show_text) for r in recent_items[:RECENT_SHOWN]],
        "finished_total": finished_total,
        "tree": tree_nodes(snapshot.tree, decode),
    }
