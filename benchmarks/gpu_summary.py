"""The summary of benchmarks/gpu_check.sh (and gpu_fp8.sh): the steps' exit codes, the tests' last
line, and the benchmarks' JSON lines as tables (one-batch decode against the HBM roofline, FP8
weights against bf16 where both ran, the share of decode time outside the forward with and without
overlap, serving).

Usage: python3 benchmarks/gpu_summary.py OUT_DIR [TITLE]   (prints it; the scripts write it to
summary.txt)
"""

from __future__ import annotations

import json
import os
import sys


def _lines(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def one_batch_table(rows: list[dict]) -> list[str]:
    out = [
        f"{'model':<28}{'weights':>8}{'bs':>5}{'tok/s':>10}{'step ms':>9}{'fwd ms':>8}"
        f"{'outside':>9}{'MB/step':>9}"
        f"{'copy GB/s':>10}{'roofline':>9}"
    ]
    for r in rows:
        model = os.path.basename(str(r.get("model")))[:27]
        quant = r.get("quantization", "none")
        weights = r.get("dtype", "float") if quant == "none" else quant
        out.append(
            f"{model:<28}{weights:>8}{r['batch_size']:>5}"
            f"{_fmt(r.get('decode_throughput'), '.0f'):>10}"
            f"{_fmt(r.get('decode_median_ms'), '.2f'):>9}"
            f"{_fmt(r.get('forward_median_ms'), '.2f'):>8}"
            f"{_fmt(r.get('outside_forward_share'), '.1%'):>9}"
            f"{_fmt(r.get('step_bytes_mb'), '.0f'):>9}"
            f"{_fmt(r.get('read_gbps'), '.0f'):>10}{_fmt(r.get('roofline_share'), '.0%'):>9}"
        )
    return out


def quantized_vs_float(rows: list[dict]) -> list[str]:
    """Per model and batch size run both ways: the quantized weights' decode rate and bytes per step
    against the float weights'."""
    float_rows = {
        (r.get("model"), r["batch_size"]): r
        for r in rows
        if r.get("quantization", "none") == "none"
    }
    out = []
    for r in rows:
        base = float_rows.get((r.get("model"), r["batch_size"]))
        if r.get("quantization", "none") == "none" or base is None:
            continue
        tok, tok0 = r.get("decode_throughput"), base.get("decode_throughput")
        mb, mb0 = r.get("step_bytes_mb"), base.get("step_bytes_mb")
        if tok and tok0 and mb and mb0:
            out.append(
                f"{os.path.basename(str(r.get('model')))} bs {r['batch_size']}: {r['quantization']}"
                f" {tok:.0f} tok/s vs {base.get('dtype')} {tok0:.0f} ({tok / tok0:.2f}x), "
                f"{mb:.0f} vs {mb0:.0f} MB/step ({mb / mb0:.2f}x)"
            )
    return out


def offline_table(rows: list[dict]) -> list[str]:
    out = [
        f"{'build':<34}{'overlap':<9}{'workload':<10}{'out tok/s':>10}{'decode steps':>13}"
        f"{'outside forward':>16}"
    ]
    for r in rows:
        out.append(
            f"{r.get('build', ''):<34}{str(r.get('overlap_schedule')):<9}"
            f"{r.get('workload', ''):<10}"
            f"{_fmt(r.get('output_throughput'), '.0f'):>10}{r.get('decode_steps', 0):>13}"
            f"{_fmt(r.get('decode_outside_forward'), '.2%'):>16}"
        )
    return out


def serving_table(rows: list[dict]) -> list[str]:
    out = [
        f"{'dataset':<12}{'done':>6}{'req/s':>8}{'out tok/s':>10}{'ttft p50':>9}{'ttft p99':>9}"
        f"{'itl p50':>8}"
        f"{'itl p99':>8}{'cached':>8}"
    ]
    for r in rows:
        out.append(
            f"{r.get('dataset', ''):<12}{r.get('completed', 0):>6}"
            f"{_fmt(r.get('request_throughput'), '.2f'):>8}"
            f"{_fmt(r.get('output_throughput'), '.0f'):>10}{_fmt(r.get('p50_ttft_ms'), '.0f'):>9}"
            f"{_fmt(r.get('p99_ttft_ms'), '.0f'):>9}{_fmt(r.get('p50_itl_ms'), '.1f'):>8}"
            f"{_fmt(r.get('p99_itl_ms'), '.1f'):>8}{_fmt(r.get('cached_token_share'), '.0%'):>8}"
        )
    return out


def summary(out_dir: str, title: str = "gpu_check") -> str:
    lines = [f"# {title} summary", ""]
    steps = os.path.join(out_dir, "steps.txt")
    if os.path.exists(steps):
        lines += [
            "## steps (exit code 0: ok, 124: timed out, skipped: no time left)",
            open(steps).read().rstrip(),
            "",
        ]
    tests = os.path.join(out_dir, "tests.log")
    if os.path.exists(tests):
        text = open(tests).read().splitlines()
        results = [
            ln
            for ln in text
            if ln.startswith("=== ")
            or (" in " in ln and any(w in ln for w in (" passed", " failed", " skipped", " error")))
        ]
        failed = [ln for ln in text if ln.startswith(("FAILED ", "ERROR "))][:20]
        lines += [
            "## tests (each run's command and result line; the failures)",
            *results,
            *failed,
            "",
        ]
    rows = _lines(os.path.join(out_dir, "results.jsonl"))
    one = [r for r in rows if "batch_size" in r]
    off = [r for r in rows if "overlap_schedule" in r]
    srv = [r for r in rows if "dataset" in r and "completed" in r]
    if one:
        lines += [
            (
                "## one-batch decode (bf16 activations; roofline: weights as held + KV bytes per"
                " step / copy rate / step time)"
            ),
            *one_batch_table(one),
            "",
        ]
        versus = quantized_vs_float(one)
        if versus:
            lines += ["## quantized weights against float (one-batch)", *versus, ""]
    if off:
        lines += ["## decode time outside the forward (bench offline)", *offline_table(off), ""]
    if srv:
        lines += ["## serving (bench serving)", *serving_table(srv), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
    print(summary(out_dir, *sys.argv[2:3]))
