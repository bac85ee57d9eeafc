"""The router's workers: URLs with a health state, an in-flight count and a circuit breaker.

A worker gets no traffic, and never the workers' key, until it is verified: its /health answers
200 and its /get_model_info describes a model as a radixlm or SGLang server does (asked without
the key first; with it only when the keyless answer is such a server's "missing API key"). An
allow-list of host patterns (`--worker-allowlist`) bounds which URLs may be added at all. Health
checks go to /health without the key (it is open on radixlm and SGLang servers).

Health checks (GET /health) run every `interval` seconds with a `timeout`; a worker turns
unhealthy after `failure_threshold` failures in a row and healthy again after
`success_threshold` successes. Requests count too: a connection error or a 5xx opens the
circuit after `failure_threshold` in a row, so a dead worker stops getting traffic before the
next check notices; the checks close it again.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

logger = logging.getLogger(__name__)


@dataclass
class HealthConfig:
    interval: float = 5.0  # seconds between checks of a worker
    timeout: float = 3.0  # seconds a check may take
    failure_threshold: int = 3  # failures in a row that mark a worker unhealthy
    success_threshold: int = 2  # successes in a row that mark it healthy again


class WorkerNotAllowed(ValueError):
    """A worker URL whose host --worker-allowlist does not name."""


@dataclass
class Worker:
    url: str
    healthy: bool = False  # verified and its breaker closed
    verified: bool = False  # passed the probe once: a radixlm / SGLang server
    note: str = "not probed yet"  # why it is not verified
    load: int = 0  # requests the router has in flight there
    failures: int = 0  # in a row (checks and requests)
    successes: int = 0  # checks in a row
    routed: int = 0  # requests sent there since it was added
    errors: int = 0  # of them, failed (connection error or 5xx)

    def as_dict(self) -> dict:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "verified": self.verified,
            "note": self.note,
            "load": self.load,
            "routed": self.routed,
            "errors": self.errors,
        }


@dataclass
class WorkerRegistry:
    health: HealthConfig = field(default_factory=HealthConfig)
    headers: dict = field(default_factory=dict)  # sent to verified workers (their API key)
    on_unhealthy: Callable[[str], None] | None = None  # a worker went down: drop its tree entries
    allowlist: tuple[
        str, ...
    ] = ()  # host patterns (fnmatch) a worker URL must match; empty: any host
    workers: dict[str, Worker] = field(default_factory=dict)

    def add(self, url: str) -> Worker:
        url = normalize_url(url)
        if self.allowlist and not host_allowed(url, self.allowlist):
            raise WorkerNotAllowed(f"worker {url} is not on --worker-allowlist")
        if url not in self.workers:
            self.workers[url] = Worker(url)
        return self.workers[url]

    def remove(self, url: str) -> bool:
        w = self.workers.pop(normalize_url(url), None)
        if w is not None and self.on_unhealthy:
            self.on_unhealthy(w.url)
        return w is not None

    def healthy(self) -> list[str]:
        return [u for u, w in self.workers.items() if w.healthy and w.verified]

    def verified(self) -> list[str]:
        return [u for u, w in self.workers.items() if w.verified]

    def loads(self) -> dict[str, int]:
        return {u: w.load for u, w in self.workers.items()}

    def record(self, url: str, ok: bool) -> None:
        """A check's or a request's outcome."""
        w = self.workers.get(url)
        if w is None or not w.verified:
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
        w = self.workers.get(url)
        if w is not None and not w.verified:
            return await self._verify(client, w)
        try:
            r = await client.get(url + "/health", timeout=self.health.timeout)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        self.record(url, ok)
        return ok

    async def _verify(self, client: httpx.AsyncClient, w: Worker) -> bool:
        problem = await probe_worker(client, w.url, self.headers, self.health.timeout)
        if problem is not None:
            if problem != w.note:  # once per change, not at every check
                logger.warning("worker %s gets no traffic: %s", w.url, problem)
            w.note = problem
            return False
        if self.workers.get(w.url) is w:  # not removed while the probe ran
            w.verified, w.healthy, w.note, w.failures = True, True, "", 0
            logger.info("worker %s verified and healthy", w.url)
        return True

    async def check_all(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self.check(client, u) for u in list(self.workers)))

    async def run_health_checks(self, client: httpx.AsyncClient) -> None:
        while True:
            await self.check_all(client)
            await asyncio.sleep(self.health.interval)


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"worker url must start with http:// or https://, got {url[:200]!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as e:
        raise ValueError(f"worker url {url[:200]!r} is malformed: {e}") from None
    if not parts.hostname or "@" in parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            "worker url must be scheme://host[:port][/path], without credentials, query or "
            f"fragment, got {url[:200]!r}"
        )
    return url


def host_allowed(url: str, patterns: tuple[str, ...]) -> bool:
    """Whether a pattern (fnmatch: "10.0.*", "*.internal", "gpu-?:30000") matches the URL's host,
    or its host:port."""
    parts = urlsplit(url)
    names = {parts.hostname or "", parts.netloc.lower()}
    return any(fnmatch.fnmatchcase(n, p.strip().lower()) for p in patterns for n in names)


_PROBE_BYTES = 1 << 16  # a probe reads at most this much of an answer


async def _get(
    client: httpx.AsyncClient, url: str, headers: dict, timeout: float
) -> tuple[int, object]:
    """(status, JSON body or None), reading at most _PROBE_BYTES."""
    async with client.stream("GET", url, headers=headers, timeout=timeout) as r:
        body = b""
        async for chunk in r.aiter_bytes():
            body += chunk
            if len(body) > _PROBE_BYTES:
                return r.status_code, None
    try:
        return r.status_code, json.loads(body)
    except ValueError:
        return r.status_code, None


def _asks_for_key(body) -> bool:
    """A radixlm ({"error": {"type": "authentication_error"}}) or SGLang ({"error": "Unauthorized"})
    401."""
    err = body.get("error") if isinstance(body, dict) else None
    return err == "Unauthorized" or (
        isinstance(err, dict) and err.get("type") == "authentication_error"
    )


async def probe_worker(
    client: httpx.AsyncClient, url: str, headers: dict, timeout: float
) -> str | None:
    """None when `url` is a serving radixlm / SGLang worker, else what is wrong. The key (headers)
    goes only to a server whose keyless answer already was such a server's 401."""
    try:
        status, _ = await _get(client, url + "/health", {}, timeout)
        if status != 200:
            return f"/health answered {status}"
        status, body = await _get(client, url + "/get_model_info", {}, timeout)
        if status == 401 and headers and _asks_for_key(body):
            status, body = await _get(client, url + "/get_model_info", headers, timeout)
    except httpx.HTTPError as e:
        return f"not reachable ({type(e).__name__})"
    if status != 200:
        return f"/get_model_info answered {status}"
    if not (
        isinstance(body, dict)
        and isinstance(body.get("model_path"), str)
        and "is_generation" in body
    ):
        return "/get_model_info does not describe a model as a radixlm or SGLang server does"
    return None
