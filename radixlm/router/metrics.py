"""The router's Prometheus metrics, read from its state at scrape time: per-worker load, health,
routed requests and errors, the cache-aware policy's decisions and its tree per worker, and the
time routing takes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixlm.router.policies import Policy
from radixlm.router.workers import WorkerRegistry


class MetricsSource(Protocol):
    """What the metrics read at scrape time (server.RouterState has it). A protocol of its own,
    so that metrics does not import the server that serves them (no import cycle)."""

    registry: WorkerRegistry
    policy: Policy
    route_seconds: Iterable[float]  # the policy's time per routed request, the latest ones
    worker_cache: dict[str, dict]  # each worker's internal state at the last scrape


class _Collector:
    def __init__(self, state: MetricsSource):
        self.state = state

    def collect(self):
        st = self.state
        workers = list(st.registry.workers.values())
        load = GaugeMetricFamily(
            "radixlm_router:worker_load", "Requests in flight at the worker", labels=["worker"]
        )
        healthy = GaugeMetricFamily(
            "radixlm_router:worker_healthy", "1 while the worker takes traffic", labels=["worker"]
        )
        routed = CounterMetricFamily(
            "radixlm_router:requests_routed",
            "Requests sent to the worker (retries included)",
            labels=["worker"],
        )
        errors = CounterMetricFamily(
            "radixlm_router:worker_errors",
            "Requests the worker failed (connection, 5xx)",
            labels=["worker"],
        )
        for w in workers:
            load.add_metric([w.url], w.load)
            healthy.add_metric([w.url], 1.0 if w.healthy else 0.0)
            routed.add_metric([w.url], w.routed)
            errors.add_metric([w.url], w.errors)
        yield from (load, healthy, routed, errors)
        decisions = getattr(st.policy, "decisions", None)
        if decisions is not None:
            d = CounterMetricFamily(
                "radixlm_router:cache_aware_decisions",
                "Routing decisions: cache_hit (followed a cached prefix), cache_miss, imbalanced",
                labels=["kind"],
            )
            for kind, n in decisions.items():
                d.add_metric([kind], n)
            yield d
            total = sum(decisions.values())
            yield GaugeMetricFamily(
                "radixlm_router:cache_aware_hit_rate",
                "Share of routed requests that followed a prefix the router's tree holds",
                value=decisions["cache_hit"] / total if total else 0.0,
            )
            tree = GaugeMetricFamily(
                "radixlm_router:tree_chars",
                "Characters of request text the tree holds per worker",
                labels=["worker"],
            )
            for tenant, chars in st.policy.tree.tenant_chars.items():
                tree.add_metric([tenant], chars)
            yield tree
        if st.kv is not None:
            yield CounterMetricFamily(
                "radixlm_router:kv_events_hits",
                "Cache hits decided by the workers' KV events (--kv-events)",
                value=st.policy.kv_events_hits,
            )
            blocks = GaugeMetricFamily(
                "radixlm_router:kv_events_blocks",
                "Live KV blocks per worker, as its KV events say (--kv-events)",
                labels=["worker"],
            )
            for worker, view in st.kv.index.stats().items():
                blocks.add_metric([worker], view["blocks"])
            yield blocks
        yield from _worker_cache_metrics(st.worker_cache)
        rs = sorted(st.route_seconds)
        yield GaugeMetricFamily(
            "radixlm_router:route_seconds_p50",
            "Median time the policy takes per request (last 1000)",
            value=rs[len(rs) // 2] if rs else 0.0,
        )


def _worker_cache_metrics(worker_cache: dict[str, dict]):
    """The workers' radix-cache hit rates as they report them (since their start or last flush)."""
    rate = GaugeMetricFamily(
        "radixlm_router:worker_cache_hit_rate",
        "Worker's prompt tokens served from its cache / its prompt tokens",
        labels=["worker"],
    )
    prompt = GaugeMetricFamily(
        "radixlm_router:worker_prompt_tokens", "Worker's prompt tokens", labels=["worker"]
    )
    cached = GaugeMetricFamily(
        "radixlm_router:worker_cached_tokens",
        "Worker's prompt tokens served from its cache",
        labels=["worker"],
    )
    total_prompt = total_cached = 0
    for url, st in worker_cache.items():
        p, c = st.get("prompt_tokens", 0), st.get("cached_tokens", 0)
        total_prompt, total_cached = total_prompt + p, total_cached + c
        rate.add_metric([url], c / p if p else 0.0)
        prompt.add_metric([url], p)
        cached.add_metric([url], c)
    yield from (rate, prompt, cached)
    yield GaugeMetricFamily(
        "radixlm_router:cache_hit_rate",
        "All workers' cached prompt tokens / prompt tokens",
        value=total_cached / total_prompt if total_prompt else 0.0,
    )


class RouterMetrics:
    def __init__(self, state: MetricsSource):
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(state))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
