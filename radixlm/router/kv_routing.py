"""`radixlm router --kv-events`: the cache_aware policy fed by the workers' KV events.

KvEventsRouting holds the index (kv_index.py) and the subscriber (kv_events.py) and does the
router's side of them on its event loop: it finds each verified worker's publisher (its
/get_server_info's kv_events_config), subscribes, and drops the sockets of workers removed; and it
gives a request's token ids to the policy: those in the body (native input_ids, a completions
prompt of ids), else the ids the worker's own /tokenize gives its prompt text (the ids the worker
will cache: one short call to a worker). Chat and the other APIs are rendered by the worker's
template before tokenizing, which the router does not repeat: they are routed on the text tree.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from radixlm.router.kv_events import KvEventSubscriber, subscriber_endpoints
from radixlm.router.kv_index import KvEventIndex
from radixlm.router.routing_text import routing_tokens, tokenizable_text
from radixlm.router.workers import WorkerRegistry

logger = logging.getLogger(__name__)

DISCOVERY_INTERVAL_SECS = 1.0


class KvEventsRouting:
    def __init__(self) -> None:
        self.index = KvEventIndex()
        self.subscriber: KvEventSubscriber | None = None
        self.probed: dict[str, str] = {}  # worker -> what its server info said ("none": no events)

    def start(self) -> None:
        self.subscriber = KvEventSubscriber(self.index)

    def shutdown(self) -> None:
        if self.subscriber is not None:
            self.subscriber.shutdown()

    async def run_discovery(self, registry: WorkerRegistry, client: httpx.AsyncClient) -> None:
        while True:
            await self.discover(registry, client)
            await asyncio.sleep(DISCOVERY_INTERVAL_SECS)

    async def discover(self, registry: WorkerRegistry, client: httpx.AsyncClient) -> None:
        """Subscribe to the verified workers not asked yet; unsubscribe the removed."""
        verified = set(registry.verified())
        for worker in list(self.probed):
            if worker not in registry.workers:
                del self.probed[worker]
                self.subscriber.unsubscribe(worker)
        for worker in verified - set(self.probed):
            try:
                r = await client.get(
                    worker + "/get_server_info",
                    headers=registry.headers,
                    timeout=registry.health.timeout,
                )
                info = r.json() if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue  # asked again at the next round
            if info is None:
                continue
            endpoints = subscriber_endpoints(worker, info)
            self.probed[worker] = endpoints[0] if endpoints else "none"
            if endpoints is None:
                logger.info("worker %s publishes no KV events: routed on the text tree", worker)
            else:
                self.subscriber.subscribe(worker, endpoints)

    async def tokens(
        self, registry: WorkerRegistry, client: httpx.AsyncClient, path: str, body: Any
    ) -> list[int] | None:
        ids = routing_tokens(path, body)
        if ids is not None:
            return ids
        text = tokenizable_text(path, body)
        workers = [w for w in registry.healthy() if self.index.synced(w)]
        if text is None or not workers:
            return None
        try:
            r = await client.post(
                workers[0] + "/tokenize",
                json={"text": text},
                headers=registry.headers,
                timeout=registry.health.timeout,
            )
            ids = r.json().get("tokens") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return ids if isinstance(ids, list) else None

    def stats(self) -> dict:
        return {w: {"endpoint": e, **self.index.stats().get(w, {})} for w, e in self.probed.items()}
