"""SWARadixCache: the radix tree of a model with sliding-window layers over SWATokenToKVPool
(SGLang's SWARadixCache).

A node's slots always hold the full-attention layers' KV; the windowed layers' KV of some of them
may be gone (the pool maps such a slot to no swa slot): a running request freed it as its tokens
left its window, or the tree evicted it under pressure on the smaller swa pool (`evict_swa`,
least recently used nodes first, internal ones too, sparing what a running request's window reads:
the pool's pins). Continuing a prefix of length l reads the full layers' whole prefix but the
windowed layers only from position l - window on, so `match_prefix` returns the longest cached
prefix whose last `window` tokens keep their windowed KV; the KV of the rest of the path is
recomputed with the request and freed as a duplicate when it is inserted (its windowed part moves
to the tree's slots where those lost theirs: the cache manager's `adopt_duplicates`).

Full eviction is RadixCache's: an evicted node gives back both parts.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import MatchResult, PrefixKey
from radixlm.cache.payloads import WindowedKV
from radixlm.cache.radix_cache import RadixCache

if TYPE_CHECKING:
    from radixlm.cache.swa_pool import SWATokenToKVPool


class SWARadixCache(RadixCache):
    def __init__(self, token_to_kv_pool: SWATokenToKVPool, window: int):
        self.window = window
        super().__init__(token_to_kv_pool)

    PARTS = (WindowedKV,)

    # --- lookup ------------------------------------------------------------------
    def _match(self, key: PrefixKey, split: bool) -> MatchResult:
        full = RadixCache._match(self, key, split=False)
        n = self.usable_len(full.indices)
        if n == len(full.indices):
            if split and n:  # end the node exactly at the match, as RadixCache does
                return RadixCache._match(self, key, split=True)
            return full
        return RadixCache._match(self, PrefixKey(key.token_ids[:n], key.namespace), split)

    def usable_len(self, slots: torch.Tensor) -> int:
        """The longest l <= len(slots) whose last `window` slots (all of them when fewer) keep
        their windowed KV: a continuation's queries read no earlier key of a windowed layer."""
        n = len(slots)
        if n == 0:
            return 0
        gone = (~self.token_to_kv_pool.has_swa(slots)).nonzero().flatten().tolist()
        if not gone:
            return n
        w = self.window
        if n - gone[-1] - 1 >= w:
            return n
        # l ends a gap of at least `window` kept slots after a lost one, or is the first loss.
        for before, after in zip(reversed(gone[:-1]), reversed(gone[1:])):
            if after - before - 1 >= w:
                return after
        return gone[0]

    # --- the windowed layers' eviction -------------------------------------------
    def evict_swa(self, num_tokens: int) -> int:
        """Free the windowed KV of least recently used nodes (unpinned slots) until num_tokens
        swa slots are freed or none is left; the nodes keep their full layers' KV."""
        if num_tokens <= 0:
            return 0
        pool = self.token_to_kv_pool
        freed = 0
        nodes = [n for n in self.all_nodes() if n.value is not None and len(n.value)]
        for node in heapq.nsmallest(len(nodes), nodes):
            if freed >= num_tokens:
                break
            take = pool.evictable_swa(node.value)
            if bool(take.any()):
                freed += pool.free_swa(node.value[take])
        return freed

    def swa_evictable_size(self) -> int:
        values = [n.value for n in self.all_nodes() if n.value is not None]
        if not values:
            return 0
        return int(self.token_to_kv_pool.evictable_swa(torch.cat(values)).sum())
