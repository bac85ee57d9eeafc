"""SGLang's Prometheus metrics on /metrics (--enable-metrics): every metric name and label that our
shipped dashboard (examples/monitoring/radixlm-dashboard.json) and SGLang's published one query is
there after a few requests through the official `openai` client, with sane values: request counts
equal the requests made, token counters equal the tokens the responses' usage reports."""

import json
import re
from pathlib import Path

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from radixlm.server.process import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
DASHBOARD = (
    Path(__file__).resolve().parents[2] / "examples" / "monitoring" / "radixlm-dashboard.json"
)
# What SGLang's own dashboard (github.com/sgl-project/sglang,
# examples/monitoring/grafana/dashboards/json/ sglang-dashboard.json) queries: metric -> the labels
# its queries and variables name.
SGLANG_DASHBOARD = {
    "sglang:e2e_request_latency_seconds_bucket": {"le", "model_name"},
    "sglang:e2e_request_latency_seconds_sum": set(),
    "sglang:e2e_request_latency_seconds_count": set(),
    "sglang:time_to_first_token_seconds_bucket": {"le", "model_name"},
    "sglang:time_to_first_token_seconds_sum": set(),
    "sglang:time_to_first_token_seconds_count": set(),
    "sglang:num_running_reqs": set(),
    "sglang:gen_throughput": set(),
    "sglang:cache_hit_rate": set(),
    "sglang:num_queue_reqs": set(),
}
# Labels Prometheus adds to every scraped series itself (the target's), not the server's to export.
TARGET_LABELS = {"instance", "job"}
SERVED = "tiny-served-name"


def dashboard_queries(dashboard: dict) -> dict[str, set[str]]:
    """metric name -> label names, from every panel query and template variable of a Grafana
    dashboard."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    out: dict[str, set[str]] = {}
    for e in exprs:
        for m in re.finditer(r"(sglang:[A-Za-z0-9_:]+)(\{[^}]*\})?", e):
            labels = out.setdefault(m.group(1), set())
            labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*=~?", m.group(2) or ""))
            if m.group(1).endswith("_bucket"):
                labels.add("le")  # histogram_quantile reads the buckets' le
        for grouped in re.findall(
            r"by\s*\(([^)]*)\)", e
        ):  # sum by (...) over the metrics of this query
            for name in re.findall(r"sglang:[A-Za-z0-9_:]+", e):
                out[name] |= {
                    g.strip()
                    for g in grouped.split(",")
                    if g.strip() != "le" or name.endswith("_bucket")
                }
        for metric, label in re.findall(
            r"label_values\(\s*(sglang:[A-Za-z0-9_:]+)\s*,\s*(\w+)\s*\)", e
        ):
            out[metric].add(label)
    return out


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    s = ServerProcess(
        "--model-path", tiny_model_dir, "--served-model-name", SERVED, "--enable-metrics", *TINY
    )
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
    usages = []
    prefix = "A shared prefix that the radix cache keeps for the next requests. " * 4
    for q in ("one?", "two?", "three?"):
        r = client.chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": prefix + q}], max_tokens=6
        )
        usages.append(r.usage)
    for q in ("four", "five"):
        r = client.completions.create(model=SERVED, prompt=prefix + q, max_tokens=4, temperature=0)
        usages.append(r.usage)
    chunks = list(
        client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": "streamed"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usages.append(chunks[-1].usage)
    metrics = requests.get(s.url + "/metrics", timeout=10).text
    info = requests.get(s.url + "/get_server_info", timeout=10).json()
    s.stop()
    return metrics, usages, info


def _samples(text: str) -> list:
    return [smp for fam in text_string_to_metric_families(text) for smp in fam.samples]


@pytest.mark.parametrize("which", ["ours", "sglang's"])
def test_every_queried_name_and_label_is_exported(served, which):
    text, _, _ = served
    wanted = (
        dashboard_queries(json.loads(DASHBOARD.read_text()))
        if which == "ours"
        else SGLANG_DASHBOARD
    )
    assert len(wanted) >= 10
    exported: dict[str, set[str]] = {}
    for smp in _samples(text):
        exported.setdefault(smp.name, set()).update(smp.labels)
    for name, labels in wanted.items():
        assert name in exported, f"{name} is not on /metrics"
        missing = labels - TARGET_LABELS - exported[name]
        assert not missing, f"{name} lacks the label(s) {missing}"


def test_values_match_the_requests(served):
    text, usages, info = served
    n = len(usages)
    by_name: dict[str, list] = {}
    for smp in _samples(text):
        by_name.setdefault(smp.name, []).append(smp)

    def value(name: str, **labels) -> float:
        (smp,) = [s for s in by_name[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        return smp.value

    model = {"model_name": SERVED}
    assert value("sglang:num_requests_total", **model) == n
    assert value("sglang:num_aborted_requests_total", **model) == 0
    assert value("sglang:prompt_tokens_total", **model) == sum(u.prompt_tokens for u in usages)
    assert value("sglang:generation_tokens_total", **model) == sum(
        u.completion_tokens for u in usages
    )
    for h in ("e2e_request_latency_seconds", "time_to_first_token_seconds"):
        assert value(f"sglang:{h}_count", **model) == n
        assert value(f"sglang:{h}_bucket", le="+Inf", **model) == n
        assert 0 < value(f"sglang:{h}_sum", **model) < 60 * n
    # One inter-token gap per output token after the first.
    assert value("sglang:inter_token_latency_seconds_count", **model) == sum(
        u.completion_tokens - 1 for u in usages
    )
    assert (
        0
        < value("sglang:cached_tokens_total", cache_source="total", **model)
        < value("sglang:prompt_tokens_total")
    )
    sched = {**model, "engine_type": "unified", "tp_rank": "0"}
    assert (
        value("sglang:num_running_reqs", **sched) == 0
        and value("sglang:num_queue_reqs", **sched) == 0
    )
    assert (
        value("sglang:num_used_tokens", **sched) == 0 and value("sglang:token_usage", **sched) == 0
    )
    assert value("sglang:max_total_num_tokens", **sched) == info["max_total_num_tokens"]
    assert value("sglang:cache_hit_rate", **sched) == pytest.approx(
        info["internal_state"]["cache_hit_rate"]
    )
    assert (
        0 < value("sglang:cache_hit_rate", **sched) < 1
        and value("sglang:gen_throughput", **sched) > 0
    )
    # radixlm's own names stay beside SGLang's, with the same counts.
    assert value("radixlm:prompt_tokens_total") == value("sglang:prompt_tokens_total", **model)
