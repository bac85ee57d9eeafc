"""Metrics of `radixlm bench serving`: from per-request outputs to one result dict, a table and a
plot."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixlm.bench.serving_client import RequestOutput

PERCENTILES = (("p50", 50), ("p90", 90), ("p99", 99))
LATENCIES = ("ttft", "tpot", "itl", "e2e")  # each reported as {mean,p50,p90,p99}_{name}_ms


def _stats(name: str, seconds: Sequence[float]) -> dict:
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    res = {f"mean_{name}_ms": float(ms.mean()) if ms.size else None}
    for label, q in PERCENTILES:
        res[f"{label}_{name}_ms"] = float(np.percentile(ms, q)) if ms.size else None
    return res


def compute_metrics(outputs: Sequence[RequestOutput], duration: float) -> dict:
    """outputs: every measured request (failed ones included), with prompt_len and output_len
    filled in; duration: seconds from the first send to the last answer."""
    ok = [o for o in outputs if o.success]
    prompt = sum(o.prompt_len or 0 for o in ok)
    output = sum(o.output_len or 0 for o in ok)
    known = [o for o in ok if o.cached_tokens is not None]
    known_prompt = sum(o.prompt_len or 0 for o in known)
    # TPOT of one request: its decode time spread over the tokens after the first.
    tpot = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if (o.output_len or 0) > 1]
    res = {
        "duration_s": duration,
        "completed": len(ok),
        "errors": len(outputs) - len(ok),
        # Sent again after a stale keep-alive connection (no answer had started): not errors.
        "retried_requests": sum(1 for o in outputs if o.retries),
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "input_throughput": prompt / duration if duration > 0 else 0.0,
        "output_throughput": output / duration if duration > 0 else 0.0,
        "total_token_throughput": (prompt + output) / duration if duration > 0 else 0.0,
        # Mean number of requests in flight (Little's law).
        "concurrency": sum(o.latency for o in ok) / duration if duration > 0 else 0.0,
        # None when the server reports no cached counts (unknown, not zero).
        "cached_tokens": sum(o.cached_tokens for o in known) if known else None,
        "cached_token_share": (
            sum(o.cached_tokens for o in known) / known_prompt if known_prompt else None
        ),
    }
    res.update(_stats("ttft", [o.ttft for o in ok]))
    res.update(_stats("tpot", tpot))
    res.update(_stats("itl", [g for o in ok for g in o.itl]))
    res.update(_stats("e2e", [o.latency for o in ok]))
    judged = [o.json_valid for o in ok if o.json_valid is not None]
    res["json_valid_share"] = sum(judged) / len(judged) if judged else None
    first_errors = sorted({o.error for o in outputs if not o.success})[:3]
    res["error_samples"] = first_errors
    return res


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.4f}"
    return str(v)


def format_table(res: dict, title: str = "Serving benchmark") -> str:
    rows: list[tuple[str, str] | None] = [
        ("Backend / dataset", f"{res.get('backend')} / {res.get('dataset')}"),
        ("Completed / errors", f"{res['completed']} / {res['errors']}"),
        ("Retried (stale connection)", str(res.get("retried_requests", 0))),
        ("Duration (s)", _fmt(res["duration_s"])),
        (
            "Total input / output tokens",
            f"{res['total_input_tokens']} / {res['total_output_tokens']}",
        ),
        ("Request throughput (req/s)", _fmt(res["request_throughput"])),
        ("Input throughput (tok/s)", _fmt(res["input_throughput"])),
        ("Output throughput (tok/s)", _fmt(res["output_throughput"])),
        ("Total throughput (tok/s)", _fmt(res["total_token_throughput"])),
        ("Concurrency (mean in flight)", _fmt(res["concurrency"])),
        ("Cached token share", _fmt(res["cached_token_share"])),
    ]
    if res.get("json_valid_share") is not None:
        rows.append(("Valid JSON share", _fmt(res["json_valid_share"])))
    lines = [f"{'=' * 20} {title} {'=' * 20}"]
    lines += [f"{k:<34}{v:>18}" for k, v in rows]
    lines.append(
        f"{'latency (ms)':<14}" + "".join(f"{c:>12}" for c in ("mean", "p50", "p90", "p99"))
    )
    for name in LATENCIES:
        vals = [res[f"{s}_{name}_ms"] for s in ("mean", "p50", "p90", "p99")]
        lines.append(f"{name.upper():<14}" + "".join(f"{_fmt(v):>12}" for v in vals))
    for e in res.get("error_samples") or []:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    """A PNG: throughput bars on the left, latency mean / percentiles on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["input tok/s", "output tok/s", "total tok/s"]
    vals = [res["input_throughput"], res["output_throughput"], res["total_token_throughput"]]
    bars = ax1.bar(names, vals, color=["#4c72b0", "#dd8452", "#55a868"])
    ax1.bar_label(bars, fmt="%.1f")
    ax1.set_title(f"throughput ({res['request_throughput']:.2f} req/s)")
    ax1.set_ylabel("tokens / s")
    stats = ("mean", "p50", "p90", "p99")
    x = np.arange(len(LATENCIES))
    width = 0.2
    top = 1.0
    for i, s in enumerate(stats):
        ys = [res[f"{s}_{n}_ms"] or 0.0 for n in LATENCIES]
        top = max(top, *ys)
        ax2.bar(x + (i - 1.5) * width, ys, width, label=s)
    ax2.set_xticks(x, [n.upper() for n in LATENCIES])
    ax2.set_yscale("symlog", linthresh=1.0)
    ax2.set_ylim(0, top * 10)  # room for the legend above the bars
    ax2.set_ylabel("ms (log)")
    ax2.set_title("latency")
    ax2.legend(ncols=4, fontsize=8, loc="upper center")
    share = res.get("cached_token_share")
    fig.suptitle(
        f"{res.get('backend')} · {res.get('dataset')} · {res['completed']} requests"
        + (f" · cached {share:.0%}" if share is not None else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
