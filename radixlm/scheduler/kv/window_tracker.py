"""WindowTracker: the windowed layers' KV of a model with sliding-window layers over
SWATokenToKVPool, moved with the requests' KV by the CacheManager.

A query at position p of a windowed layer reads keys [p - window + 1, p] only. So:

    a step      before its slots are allocated, a request's own tokens that no later query reads
                (positions < kv_allocated_len - window + 1) give back their windowed KV
                (`trim`); the full layers' KV stays
    admission   the tree's last `window` slots of the matched prefix are pinned (the pool's pins):
                the request's first queries read them, so the tree must not evict them
    cache_req   the pins move to the last `window` slots of the newly cached prefix; where the tree
                held the request's tokens already and lost their windowed KV, the request's copy
                takes its place (`adopt_duplicates`)
    release     the pins go
    budget      `room`: the swa slots an allocation can get; `make_room` evicts the tree's
                windowed KV (SWARadixCache.evict_swa) when the swa pool is short

Models without windowed layers, and --disable-hybrid-swa-memory, get NoWindowTracker, its no-op
sibling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import PrefixKey

if TYPE_CHECKING:
    from radixlm.cache.base_prefix_cache import BasePrefixCache
    from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixlm.cache.swa_pool import SWATokenToKVPool
    from radixlm.scheduler.req import Req


class BaseWindowTracker(ABC):
    @abstractmethod
    def trim(self, reqs: list[Req]) -> None:
        """A step of reqs is about to allocate: free what their windows no longer read."""

    @abstractmethod
    def room(self) -> int | None:
        """Windowed-layer slots an allocation can get (None: no limit beyond the full pool's)."""

    @abstractmethod
    def make_room(self, need: int) -> None: ...

    @abstractmethod
    def on_assign(self, req: Req) -> None: ...

    @abstractmethod
    def adopt_duplicates(self, req: Req, key: PrefixKey, start: int, end: int) -> None:
        """req's slots [start, end) duplicate the tree's copy of key[:end], about to be freed."""

    @abstractmethod
    def on_cached(self, req: Req, committed: int) -> None: ...

    @abstractmethod
    def on_release(self, req: Req) -> None: ...

    @abstractmethod
    def check(self, holders) -> str | None: ...

    @abstractmethod
    def info(self) -> dict:
        """The windowed layers' slot space for the internal state (/get_server_info)."""


class NoWindowTracker(BaseWindowTracker):
    """Every layer keeps every token: nothing to move."""

    def trim(self, reqs: list[Req]) -> None:
        pass

    def room(self) -> int | None:
        return None

    def make_room(self, need: int) -> None:
        pass

    def on_assign(self, req: Req) -> None:
        pass

    def adopt_duplicates(self, req: Req, key: PrefixKey, start: int, end: int) -> None:
        pass

    def on_cached(self, req: Req, committed: int) -> None:
        pass

    def on_release(self, req: Req) -> None:
        pass

    def check(self, holders) -> str | None:
        return None

    def info(self) -> dict:
        return {}


class WindowTracker(BaseWindowTracker):
    def __init__(
        self, pool: SWATokenToKVPool, rows: ReqToTokenPool, tree: BasePrefixCache, window: int
    ):
        self.pool, self.rows, self.tree, self.window = pool, rows, tree, window
        # Only a tree that tracks windowed KV (SWARadixCache) can give some back.
        self.tree_swa = tree.capabilities().tracks_windows

    def _row(self, req: Req) -> torch.Tensor:
        return self.rows.req_to_token[req.req_pool_idx]

    def trim(self, reqs: list[Req]) -> None:
        for req in reqs:
            lo = max(req.cache_protected_len, req.swa_trimmed_len)
            hi = req.kv_allocated_len - self.window + 1
            if hi > lo:
                self.pool.free_swa(self._row(req)[lo:hi])
                req.swa_trimmed_len = hi
            if req.swa_pins is not None and req.swa_pins[1] <= hi:
                self._unpin(req)  # the pinned tree slots left the window too

    def room(self) -> int | None:
        tree = self.tree.swa_evictable_size() if self.tree_swa else 0
        return self.pool.swa_available_size() + tree

    def make_room(self, need: int) -> None:
        short = need - self.pool.swa_available_size()
        if short > 0 and self.tree_swa:
            self.tree.evict_swa(short)

    def _pin(self, req: Req, end: int) -> None:
        self._unpin(req)
        start = max(0, end - self.window)
        if end > start:
            self.pool.pin(self._row(req)[start:end])
            req.swa_pins = (start, end)

    def _unpin(self, req: Req) -> None:
        if req.swa_pins is not None:
            start, end = req.swa_pins
            self.pool.unpin(self._row(req)[start:end])
            req.swa_pins = None

    def on_assign(self, req: Req) -> None:
        req.swa_trimmed_len = req.cache_protected_len
        self._pin(req, req.cache_protected_len)

    def adopt_duplicates(self, req: Req, key: PrefixKey, start: int, end: int) -> None:
        tree_slots = self.tree.kv_match(PrefixKey(key.token_ids[:end], key.namespace)).indices
        self.pool.move_swa(tree_slots[start:end], self._row(req)[start:end])

    def on_cached(self, req: Req, committed: int) -> None:
        self._pin(req, committed)

    def on_release(self, req: Req) -> None:
        self._unpin(req)
        req.swa_trimmed_len = 0

    def check(self, holders) -> str | None:
        pins = torch.zeros_like(self.pool.swa_pins)
        for r in holders:
            if r.swa_pins is not None:
                start, end = r.swa_pins
                pins[self._row(r)[start:end]] += 1
        if not torch.equal(pins, self.pool.swa_pins):
            return "windowed-layer pins differ from the running requests' windows"
        return None

    def info(self) -> dict:
        return {
            "swa_window": self.window,
            "swa_kv_tokens": self.pool.swa_size,
            "available_swa_kv_tokens": self.pool.swa_available_size(),
        }


def create_window_tracker(
    pool: TokenToKVPool, rows: ReqToTokenPool, tree: BasePrefixCache
) -> BaseWindowTracker:
    """WindowTracker over a pool with windowed-layer slots (SWATokenToKVPool), else the no-op."""
    window = pool.window  # TokenToKVPool.window: 0 unless the pool has them
    return WindowTracker(pool, rows, tree, window) if window else NoWindowTracker()
