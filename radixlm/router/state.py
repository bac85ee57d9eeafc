"""The router's options (RouterArgs) and its state while it runs (RouterState): the policy, the
workers' registry, the HTTP client, the sessions' homes and what /metrics reports."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import httpx

from radixlm.router.affinity import SessionAffinity
from radixlm.router.kv_routing import KvEventsRouting
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policies import CacheAwareConfig, CacheAwarePolicy, Policy, make_policy
from radixlm.router.workers import HealthConfig, WorkerRegistry


@dataclass
class RouterArgs:
    worker_urls: list[str] = field(default_factory=list)
    policy: str = "cache_aware"
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # clients must send it (every route but /health)
    worker_api_key: str | None = None  # sent to the verified workers
    admin_api_key: str | None = None  # the operator's: the admin routes need it
    worker_admin_api_key: str | None = (
        None  # sent to the workers for admin actions (flush, abort all)
    )
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to call the router; "*": any
    worker_allowlist: tuple[
        str, ...
    ] = ()  # host patterns (fnmatch) a worker URL must match; empty: any
    max_request_body_bytes: int = 32 * 2**20  # a larger request body is a 413
    connect_timeout: float = 5.0  # seconds to connect to a worker
    request_timeout: float = 1800.0  # seconds a worker may stay silent (no byte) on a request
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    kv_events: bool = False  # cache_aware routes on the workers' KV events (kv_routing.py)
    health: HealthConfig = field(default_factory=HealthConfig)
    max_retries: int = 3  # other workers tried for a request whose worker failed before answering
    retry_backoff: float = 0.05  # seconds before the first retry, doubled for each further one
    log_level: str = "info"
    # PD disaggregation (router/pd.py): prefill servers (url, bootstrap port or None) and decode
    # servers.
    pd_disaggregation: bool = False
    prefill_urls: list = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)
    prefill_policy: str | None = None  # None: --policy
    decode_policy: str | None = None


class RouterState:
    def __init__(self, args: RouterArgs, policy: Policy | None = None):
        self.args = args
        self.kv = KvEventsRouting() if args.kv_events else None
        if policy is None and self.kv is not None:
            policy = CacheAwarePolicy(args.cache_aware, kv_index=self.kv.index)
        self.policy = policy or make_policy(args.policy, args.cache_aware)
        headers = {"Authorization": f"Bearer {args.worker_api_key}"} if args.worker_api_key else {}
        self.registry = WorkerRegistry(
            args.health,
            headers,
            on_unhealthy=self.policy.remove_worker,
            allowlist=tuple(args.worker_allowlist),
        )
        self.admin_headers = (
            {"Authorization": f"Bearer {args.worker_admin_api_key}"}
            if args.worker_admin_api_key
            else headers
        )
        for url in args.worker_urls:
            self.registry.add(url)
        self.client: httpx.AsyncClient | None = None
        self.route_seconds: deque[float] = deque(
            maxlen=1000
        )  # the policy's time per routed request
        self.worker_cache: dict[
            str, dict
        ] = {}  # each worker's internal state at the last /metrics scrape
        self.metrics = RouterMetrics(self)
        self.sessions = SessionAffinity()

    def pick(self, text: str, tokens: list[int] | None = None) -> str | None:
        workers = self.registry.healthy()
        if not workers:
            return None
        t = time.perf_counter()
        url = self.policy.select(workers, self.registry.loads(), text, tokens)
        self.route_seconds.append(time.perf_counter() - t)
        return url
