"""Prefetcher: a request whose prefix's KV is being read from a slower tier (the hierarchical
cache's L3) waits for it as PREFETCHING (SGLang's wait_complete prefetch policy). Caches without
such a tier start no prefetch, and requests go straight on."""

from __future__ import annotations

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.scheduler.req import Req


class Prefetcher:
    def __init__(self, tree_cache: BasePrefixCache):
        self.tree_cache = tree_cache

    def start(self, req: Req) -> None:
        req.prefetch = self.tree_cache.start_prefetch(req.prefix_key(req.max_prefix_len()))

    @staticmethod
    def pending(req: Req) -> bool:
        return req.prefetch is not None and not req.prefetch.done

    def poll(self) -> None:
        """Hang what was read so far into the cache (also reads of requests aborted meanwhile)."""
        if self.tree_cache.has_prefetches():
            self.tree_cache.poll_prefetches()
