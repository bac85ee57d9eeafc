"""Prometheus metrics (--enable-metrics): token counters, latency histograms, scheduler gauges,
under radixlm's names (radixlm:...) and SGLang's (sglang:..., sglang_metrics.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from radixlm.server.sglang_metrics import SGLangMetrics

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class ServerMetrics:
    def __init__(self, tokenizer_manager, model_name: str = ""):
        self.tm = tokenizer_manager
        r = self.registry = CollectorRegistry()
        self.sglang = SGLangMetrics(
            r, model_name
        )  # model_name: the served model name, SGLang's label
        self.prompt_tokens = Counter("radixlm:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter(
            "radixlm:generation_tokens", "Tokens generated", registry=r
        )
        self.cached_tokens = Counter(
            "radixlm:cached_tokens", "Prompt tokens served from the radix cache", registry=r
        )
        self.requests = Counter(
            "radixlm:num_requests", "Finished requests", ["finish_reason"], registry=r
        )
        self.ttft = Histogram(
            "radixlm:time_to_first_token_seconds",
            "Time to first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Each request contributes its mean inter-token latency (the scheduler does not ship
        # per-token times).
        self.itl = Histogram(
            "radixlm:inter_token_latency_seconds",
            "Mean inter-token latency per request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "radixlm:e2e_request_latency_seconds",
            "End-to-end request latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge("radixlm:num_running_reqs", "Running requests", registry=r)
        self.waiting = Gauge("radixlm:num_queue_reqs", "Waiting requests", registry=r)
        self.token_usage = Gauge(
            "radixlm:token_usage", "Share of KV slots held by running requests", registry=r
        )
        self.used_tokens = Gauge(
            "radixlm:kv_used_tokens", "KV slots held by running requests", registry=r
        )
        self.cache_hit_rate = Gauge(
            "radixlm:cache_hit_rate",
            "Prompt tokens served from the cache / prompt tokens",
            registry=r,
        )
        # Speculative decoding (zero without --speculative-algorithm).
        self.spec_verify_steps = Counter(
            "radixlm:spec_verify_steps",
            "Verify steps of finished requests that carried a draft",
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "radixlm:spec_accepted_tokens", "Draft tokens accepted in finished requests", registry=r
        )
        # Hierarchical cache (zero without --enable-hierarchical-cache): per tier, since start.
        self.hicache_hit_tokens = Gauge(
            "radixlm:hicache_hit_tokens",
            "Prompt tokens loaded back from a lower tier instead of recomputed",
            ["tier"],
            registry=r,
        )
        self.hicache_loads = Gauge(
            "radixlm:hicache_loads", "Loads from a lower tier", ["tier"], registry=r
        )
        self.hicache_load_seconds = Gauge(
            "radixlm:hicache_load_seconds",
            "Time spent loading from a lower tier (L3: request arrival to its chunks in L2)",
            ["tier"],
            registry=r,
        )
        self.hicache_bytes = Gauge(
            "radixlm:hicache_bytes_moved", "Bytes moved between tiers", ["direction"], registry=r
        )
        self.hicache_used = Gauge(
            "radixlm:hicache_used", "L2 tokens held, L3 bytes held", ["tier"], registry=r
        )
        self.hicache_errors = Gauge(
            "radixlm:hicache_errors",
            "Stored chunks skipped or not written; host state snapshots that failed their checksum",
            ["kind"],
            registry=r,
        )
        # MoE models: tokens routed to each expert of each layer since start (placement, --ep-size).
        self.expert_tokens = Counter(
            "radixlm:moe_expert_tokens",
            "Tokens routed to an expert (top-k slots) since start",
            ["layer", "expert"],
            registry=r,
        )
        self._expert_seen: dict[tuple[str, str], int] = {}
        self.spec_accept_length = Gauge(
            "radixlm:spec_accept_length",
            "Tokens emitted per drafted request per verify step (accepted drafts + 1), since start",
            registry=r,
        )

    def observe_finished(self, meta: dict) -> None:
        self.sglang.observe_finished(meta)
        self.prompt_tokens.inc(meta.get("prompt_tokens", 0))
        self.generation_tokens.inc(meta.get("completion_tokens", 0))
        self.cached_tokens.inc(meta.get("cached_tokens", 0))
        self.spec_verify_steps.inc(meta.get("spec_verify_ct", 0))
        self.spec_accepted_tokens.inc(meta.get("spec_accepted_tokens", 0))
        fr = meta.get("finish_reason") or {}
        self.requests.labels(fr.get("type", "unknown")).inc()
        self.e2e.observe(meta.get("e2e_latency", 0.0))
        ttft = meta.get("ttft")
        if ttft is not None:
            self.ttft.observe(ttft)
            n = meta.get("completion_tokens", 0)
            if n > 1:
                self.itl.observe(max(0.0, meta["e2e_latency"] - ttft) / (n - 1))

    async def refresh(self) -> None:
        st = await self.tm.get_internal_state()
        total = st["max_total_num_tokens"]
        used = (
            total - st["available_kv_tokens"] - st["evictable_tokens"]
        )  # held by running requests
        self.running.set(st["num_running"])
        self.waiting.set(st["num_waiting"])
        self.used_tokens.set(used)
        self.token_usage.set(used / total if total else 0.0)
        self.cache_hit_rate.set(st["cache_hit_rate"])
        self.spec_accept_length.set(st.get("spec_accept_length", 0.0))
        self.sglang.refresh(st, used)
        self._export_expert_load(st.get("expert_load") or {})
        hc = st.get("hicache")
        if hc:
            for tier in ("l2", "l3"):
                self.hicache_hit_tokens.labels(tier).set(hc[f"{tier}_hit_tokens"])
                self.hicache_loads.labels(tier).set(hc[f"{tier}_loads"])
                self.hicache_load_seconds.labels(tier).set(hc[f"{tier}_load_seconds"])
            for direction in ("l1_to_l2", "l2_to_l1", "to_l3", "from_l3"):
                self.hicache_bytes.labels(direction).set(hc[f"bytes_{direction}"])
            self.hicache_used.labels("l2").set(hc["l2_used_tokens"])
            self.hicache_used.labels("l3").set(hc.get("l3_bytes") or 0)
            errors = ("corrupt_chunks", "read_errors", "write_errors", "writes_dropped")
            for kind in (*errors, "state_corrupt"):  # state_corrupt: a hybrid's host snapshots
                self.hicache_errors.labels(kind).set(hc[kind])

    def _export_expert_load(self, load: dict) -> None:
        """The scheduler's running totals as counter increments (a restarted engine starts from
        0)."""
        for layer, counts in load.items():
            for expert, total in enumerate(counts):
                key = (layer, str(expert))
                seen = self._expert_seen.get(key, 0)
                if total != seen:
                    self.expert_tokens.labels(*key).inc(max(0, total - seen))
                    self._expert_seen[key] = total


def mount_metrics(app: FastAPI) -> None:
    @app.get("/metrics")
    async def metrics(request: Request):
        m: ServerMetrics = request.app.state.srv.metrics
        await m.refresh()
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
