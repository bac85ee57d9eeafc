"""L3 of the hierarchical cache as a tier: which chunks of a path to store, and the prefetch of a
request's chunks back into L2.

The KV of a token sequence is stored in chunks of `chunk_size` tokens at fixed positions, keyed by
a hash chain from the model key (and the prefix's namespace); storage.py holds the backends,
hicache_io.py the background threads. HostTier (host_tier.py) decides when; this tier
knows how (BaseStorageTier: what it asks). NoStorageTier is the tier of a hierarchical cache without
--hicache-storage-backend.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable

from radixlm.cache.hicache_io import HiCacheIO, HiCacheStats, Prefetch
from radixlm.cache.kv_data import KVData
from radixlm.cache.storage import HiCacheStorage, chunk_keys

logger = logging.getLogger(__name__)

# hang(namespace, token_ids, start, chunks) -> tokens added to L2: the tree's insert of chunks read
# from L3 covering token_ids[start:].
Hang = Callable[[Hashable, list[int], int, list[KVData]], int]


class BaseStorageTier(ABC):
    prefetches: list[Prefetch]  # the reads under way, oldest first

    @abstractmethod
    def store(
        self, namespace: Hashable, ids: list[int], gather: Callable[[int, int], KVData]
    ) -> None:
        """Queue the full chunks of ids that L3 lacks; gather(lo, hi) reads tokens [lo, hi)'s KV
        now."""

    @abstractmethod
    def start_prefetch(
        self, namespace: Hashable, token_ids: list[int], cached: int
    ) -> Prefetch | None:
        """Start reading the stored chunks that continue the first `cached` tokens of token_ids
        (what L1 and L2 hold); None if there are none."""

    @abstractmethod
    def poll(self, hang: Hang) -> None:
        """Hang the chunks read so far into the tree (L2), in order."""

    @abstractmethod
    def wait_writes(self, timeout: float | None = None) -> bool:
        """Wait for the queued stores; False if some were still pending at the timeout."""

    @abstractmethod
    def clear(self) -> None:
        """Drop everything stored."""

    @abstractmethod
    def close(self) -> None:
        """Stop the background threads and the backend."""

    @abstractmethod
    def info(self) -> dict:
        """For /get_server_info's hicache section."""


class NoStorageTier(BaseStorageTier):
    """No L3: nothing is stored, nothing is prefetched."""

    def __init__(self):
        self.prefetches: list[Prefetch] = []  # stays empty

    def store(
        self, namespace: Hashable, ids: list[int], gather: Callable[[int, int], KVData]
    ) -> None:
        pass

    def start_prefetch(
        self, namespace: Hashable, token_ids: list[int], cached: int
    ) -> Prefetch | None:
        return None

    def poll(self, hang: Hang) -> None:
        pass

    def wait_writes(self, timeout: float | None = None) -> bool:
        return True

    def clear(self) -> None:
        pass

    def close(self) -> None:
        pass

    def info(self) -> dict:
        return {}


class StorageTier(BaseStorageTier):
    def __init__(
        self, backend: HiCacheStorage, model_key: str, chunk_size: int, stats: HiCacheStats
    ):
        self.backend = backend
        self.model_key = model_key
        self.chunk_size = chunk_size
        self.stats = stats
        self.io = HiCacheIO(backend, stats)
        self.prefetches: list[Prefetch] = []

    def _keys(self, namespace: Hashable, ids: list[int], n_chunks: int) -> list[str]:
        # A namespace's KV is not the common one's: it starts its own hash chain.
        root = self.model_key if namespace is None else f"{self.model_key}|{namespace}"
        return chunk_keys(root, ids, self.chunk_size, n_chunks)

    def store(
        self, namespace: Hashable, ids: list[int], gather: Callable[[int, int], KVData]
    ) -> None:
        c = self.chunk_size
        n_chunks = len(ids) // c
        if n_chunks == 0:
            return
        for i, key in enumerate(self._keys(namespace, ids, n_chunks)):
            if self.io.is_pending(key) or self.backend.exists(key):
                continue
            self.io.write(key, ids[i * c : (i + 1) * c], gather(i * c, (i + 1) * c))

    def start_prefetch(
        self, namespace: Hashable, token_ids: list[int], cached: int
    ) -> Prefetch | None:
        c = self.chunk_size
        total = len(token_ids) // c
        first = cached // c
        if first >= total:
            return None
        keys = self._keys(namespace, token_ids, total)[first:]
        futures = []
        for i, key in enumerate(keys):
            if key not in self.io.inflight and not self.backend.exists(key):
                break
            lo = (first + i) * c
            futures.append(self.io.read(key, token_ids[lo : lo + c]))
        if not futures:
            return None
        p = Prefetch(
            token_ids[: (first + len(futures)) * c],
            first * c,
            futures,
            keys[: len(futures)],
            namespace,
        )
        self.prefetches.append(p)
        return p

    def poll(self, hang: Hang) -> None:
        """Hang the chunks read so far into the tree (L2), in order, while later ones are still
        being read (the copy overlaps the reads); a prefetch is done when every read has ended."""
        c = self.chunk_size
        for p in list(self.prefetches):
            ready = []
            while (
                not p.failed
                and p.taken + len(ready) < len(p.futures)
                and p.futures[p.taken + len(ready)].done()
            ):
                f = p.futures[p.taken + len(ready)]
                data = None if f.cancelled() or f.exception() is not None else f.result()
                if data is None:
                    p.failed = True
                else:
                    ready.append(data)
            if ready:
                lo, p.taken = p.start + p.taken * c, p.taken + len(ready)
                added = hang(p.namespace, p.token_ids[: p.start + p.taken * c], lo, ready)
                self.stats.count("l3_hit_tokens", added)
                p.added += added
            # Done once every chunk is in the tree, or a read failed and the rest have ended (a read
            # that ends after `ready` was collected is taken at the next poll).
            if p.taken == len(p.futures) or (p.failed and all(f.done() for f in p.futures)):
                self.prefetches.remove(p)
                self.io.forget(p.keys)
                if p.added:
                    self.stats.count("l3_loads")
                    self.stats.count("l3_load_seconds", time.perf_counter() - p.started)
                p.done = True

    def wait_writes(self, timeout: float | None = None) -> bool:
        return self.io.wait_writes(timeout)

    def clear(self) -> None:
        self.io.wait_writes()
        try:
            self.backend.clear()
        except Exception:
            logger.exception("hicache: clearing the storage failed")

    def close(self) -> None:
        self.io.close()
        self.backend.close()

    def info(self) -> dict:
        return {"l3_bytes": self.backend.bytes}
