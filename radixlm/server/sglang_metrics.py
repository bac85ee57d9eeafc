"""SGLang's Prometheus metrics (sglang:...), beside radixlm's own (radixlm:..., metrics.py), so that
SGLang's Grafana dashboard and alert rules read a radixlm server unchanged (examples/monitoring/ has
a dashboard of ours on them). Names, types, labels and buckets are those of SGLang 0.5's
observability/metrics_collector.py: per request, labelled model_name (the served model name); the
scheduler's gauges, labelled model_name, engine_type ("unified"), tp_rank, pp_rank and moe_ep_rank.

Differences: the inter-token latency is each request's mean gap, counted once per gap (the
scheduler ships no per-token times; SGLang also observes intervals in bulk); cache_hit_rate is since
start (or the last /flush_cache) where SGLang's is the last prefill batch's; num_queue_reqs counts
requests waiting for a grammar compile too; cached tokens are labelled cache_source="total"
(SGLang's label when it has no per-tier split)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
# The scheduler's gauges: (name, documentation) as SGLang's, each read from the internal state.
_SCHEDULER_GAUGES = {
    "num_running_reqs": "The number of running requests.",
    "num_used_tokens": "The number of used tokens.",
    "token_usage": "The token usage.",
    "gen_throughput": "The generation throughput (token/s).",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "cache_hit_rate": "The prefix cache hit rate.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "spec_accept_length": "The average acceptance length of speculative decoding.",
    "num_retracted_reqs": "The number of retracted requests.",
}


def observe_many(child, value: float, count: int) -> None:
    """`count` observations of `value` in one update of the histogram child (SGLang's bulk observe
    through prometheus_client's internals; one observe() at a time where they are not there)."""
    bounds, buckets, total = (
        getattr(child, a, None) for a in ("_upper_bounds", "_buckets", "_sum")
    )
    if bounds is None or buckets is None or total is None:
        for _ in range(count):
            child.observe(value)
        return
    total.inc(value * count)
    for i, bound in enumerate(bounds):
        if value <= bound:
            buckets[i].inc(count)
            break


class SGLangMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        r = registry
        self.labels = {"model_name": model_name}
        self.scheduler_labels = {
            **self.labels,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        names = tuple(self.labels)
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", names, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            names,
            registry=r,
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            (*names, "cache_source"),
            registry=r,
        )
        self.requests = Counter(
            "sglang:num_requests_total", "Number of requests processed.", names, registry=r
        )
        self.aborted = Counter(
            "sglang:num_aborted_requests_total", "Number of requests aborted.", names, registry=r
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            names,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            names,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            names,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.gauges = {
            k: Gauge(f"sglang:{k}", doc, tuple(self.scheduler_labels), registry=r)
            for k, doc in _SCHEDULER_GAUGES.items()
        }
        # The series exist from the start (a dashboard shows 0, not "no data", before the first
        # request).
        for m in (
            self.prompt_tokens,
            self.generation_tokens,
            self.requests,
            self.aborted,
            self.ttft,
            self.itl,
            self.e2e,
        ):
            m.labels(**self.labels)

    def observe_finished(self, meta: dict) -> None:
        """One finished sequence's meta_info."""
        lab = self.labels
        self.prompt_tokens.labels(**lab).inc(meta.get("prompt_tokens", 0))
        n = meta.get("completion_tokens", 0)
        self.generation_tokens.labels(**lab).inc(n)
        if meta.get("cached_tokens", 0) > 0:
            self.cached_tokens.labels(**lab, cache_source="total").inc(meta["cached_tokens"])
        self.requests.labels(**lab).inc()
        if (meta.get("finish_reason") or {}).get("type") == "abort":
            self.aborted.labels(**lab).inc()
        e2e = meta.get("e2e_latency", 0.0)
        self.e2e.labels(**lab).observe(e2e)
        ttft = meta.get("ttft")
        if ttft is not None:
            self.ttft.labels(**lab).observe(ttft)
            if n > 1:  # one observation per gap between output tokens, at the request's mean
                observe_many(self.itl.labels(**lab), max(0.0, e2e - ttft) / (n - 1), n - 1)

    def refresh(self, st: dict, used_tokens: int) -> None:
        """The scheduler's internal state (/get_server_info's internal_state)."""
        total = st["max_total_num_tokens"]
        values = {
            "num_running_reqs": st["num_running"],
            "num_used_tokens": used_tokens,
            "token_usage": used_tokens / total if total else 0.0,
            "gen_throughput": st.get("gen_throughput", 0.0),
            "num_queue_reqs": st["num_waiting"],
            "cache_hit_rate": st["cache_hit_rate"],
            "max_total_num_tokens": total,
            "spec_accept_length": st.get("spec_accept_length", 0.0),
            "num_retracted_reqs": st.get("num_retracted", 0),
        }
        for k, v in values.items():
            self.gauges[k].labels(**self.scheduler_labels).set(v)
