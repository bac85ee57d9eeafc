"""The router's workers: URLs with a health state, an in-flight count and a circuit breaker.

Health checks (GET /health) run every `interval` seconds with a `timeout`; a worker turns
unhealthy after `failure_threshold` failures in a row and healthy again after
`success_threshold` successes. Requests count too: a connection error or a 5xx opens the
circuit after `failure_threshold` in a row, so a dead worker stops getting traffic before the
next check notices; the checks close it again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import httpx

logger = logging.getLogger(__name__)


@dataclass
class HealthConfig:
    interval: float = 5.0  # seconds between checks of a worker
    timeout: float = 3.0  # seconds a check may take
    failure_threshold: int = 3  # failures in a row that mark a worker unhealthy
    success_threshold: int = 2  # successes in a row that mark it healthy again


@dataclass
class Worker:
    url: str
    healthy: bool = True
    load: int = 0  # requests the router has in flight there
    failures: int = 0  # in a row (checks and requests)
    successes: int = 0  # checks in a row
    routed: int = 0  # requests sent there since it was added
    errors: int = 0  # of them, failed (connection error or 5xx)

    def as_dict(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "load": self.load, "routed": self.routed,
                "errors": self.errors}


@dataclass
class WorkerRegistry:
    health: HealthConfig = field(default_factory=HealthConfig)
    headers: dict = field(default_factory=dict)  # sent to workers (their API key)
    on_unhealthy: Optional[Callable[[str], None]] = None  # a worker went down: drop its tree entries
    workers: dict[str, Worker] = field(default_factory=dict)

    def add(self, url: str) -> Worker:
        url = normalize_url(url)
        if url not in self.workers:
            self.workers[url] = Worker(url)
        return self.workers[url]

    def remove(self, url: str) -> bool:
        w = self.workers.pop(normalize_url(url), None)
        if w is not None and self.on_unhealthy:
            self.on_unhealthy(w.url)
        return w is not None

    def healthy(self) -> list[str]:
        return [u for u, w in self.workers.items() if w.healthy]

    def loads(self) -> dict[str, int]:
        return {u: w.load for u, w in self.workers.items()}

    def record(self, url: str, ok: bool) -> None:
        """A check's or a request's outcome."""
        w = self.workers.get(url)
        if w is None:
            return
        if ok:
            w.failures = 0
            w.successes += 1
            if not w.healthy and w.successes >= self.health.success_threshold:
                w.healthy = True
                logger.info("worker %s is healthy again", url)
        else:
            w.successes = 0
            w.failures += 1
            if w.healthy and w.failures >= self.health.failure_threshold:
                w.healthy = False
                logger.warning("worker %s is unhealthy (%d failures in a row)", url, w.failures)
                if self.on_unhealthy:
                    self.on_unhealthy(url)

    async def check(self, client: httpx.AsyncClient, url: str) -> bool:
        try:
            r = await client.get(url + "/health", headers=self.headers, timeout=self.health.timeout)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        self.record(url, ok)
        return ok

    async def check_all(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self.check(client, u) for u in list(self.workers)))

    async def run_health_checks(self, client: httpx.AsyncClient) -> None:
        while True:
            await self.check_all(client)
            await asyncio.sleep(self.health.interval)


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"worker url must start with http:// or https://, got {url!r}")
    return url
