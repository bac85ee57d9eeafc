"""The prefix-cache interface: what the scheduler's cache manager, the scheduling policy, the
invariant checks and the speculative radix drafts may ask of a cache of KV prefixes.

Implementations: RadixCache (radix_cache.py: a radix tree over the KV pool), HiRadixCache
(hiradix_cache.py: the same tree over three tiers) and NoPrefixCache (no_prefix_cache.py:
--disable-radix-cache, nothing is shared). A cache knows token ids and KV slot tensors, never a
request: moving KV between a request and the cache is scheduler/kv/cache_manager.py's job.

What a cache can do beyond this interface it declares in `capabilities()` (CacheCapabilities); the
scheduler asks that, never whether a method exists (tests/unit/test_cache_contract.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixlm.cache.kv_events import NO_KV_EVENTS, KVEventSink

if TYPE_CHECKING:
    from radixlm.cache.hicache_io import Prefetch
    from radixlm.cache.payloads import CachePart
    from radixlm.cache.tree_node import TreeNode

FLUSH_LEVELS = (
    "l1",
    "l2",
    "l3",
)  # the KV pool; also host memory; also storage (hierarchical cache)


@dataclass(frozen=True)
class PrefixKey:
    """What a cached prefix is found by: its token ids, and a namespace. Prefixes in different
    namespaces never share KV even when their tokens agree (a LoRA adapter's KV is not the base
    model's; one tenant's cache must not answer another's probe). None: the common namespace."""

    token_ids: list[int]
    namespace: Hashable | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def child_key(self) -> Callable[[int], Hashable] | None:
        """How a tree looks a child up by its first token (radix_walk.walk's child_key)."""
        ns = self.namespace
        return None if ns is None else (lambda token: (ns, token))


class MatchResult(NamedTuple):
    indices: torch.Tensor  # int64 KV slots of the cached prefix, in position order
    last_node: TreeNode  # where the match ends: what a request locks to keep the prefix


@dataclass(frozen=True)
class CacheCapabilities:
    """What a prefix cache does beyond BasePrefixCache's methods: the scheduler picks its partner
    trackers (scheduler/kv/state_tracker.py, window_tracker.py) by these, not by probing for the
    methods that go with them."""

    # KV shared between requests at all (False: --disable-radix-cache's NoPrefixCache): ordering
    # by shared prefixes, jump-forward, session pins and radix drafts need it.
    shares_prefixes: bool = True
    # A hybrid model's state snapshots at tree nodes (MambaRadixCache: attach_state, alloc_state,
    # state_slots): only such a tree makes the StateTracker's snapshots serve later matches.
    keeps_state_snapshots: bool = False
    # The windowed layers' KV, evictable apart from the full layers' (SWARadixCache: evict_swa,
    # swa_evictable_size): the WindowTracker counts and evicts it when the swa slots run short.
    tracks_windows: bool = False

    @classmethod
    def of(cls, parts: Iterable[type[CachePart]], **fixed: bool) -> CacheCapabilities:
        """What a cache made of `parts` (payloads.py) can do: each part's CACHE_CAPABILITY."""
        declared = {p.CACHE_CAPABILITY: True for p in parts if p.CACHE_CAPABILITY is not None}
        return cls(**declared, **fixed)


class BasePrefixCache(ABC):
    root_node: TreeNode
    # Where the tree reports its blocks' moves (kv_events.py; --kv-events-config).
    events: KVEventSink = NO_KV_EVENTS

    def set_kv_events(self, sink: KVEventSink) -> None:
        """Report KV events to sink from now on (set once, at start-up, on an empty cache)."""
        self.events = sink

    @abstractmethod
    def capabilities(self) -> CacheCapabilities:
        """What this cache does beyond the methods below (the same for its whole life)."""

    # --- lookup / insert ---------------------------------------------------------
    @abstractmethod
    def match_prefix(self, key: PrefixKey) -> MatchResult:
        """Admission's match: the longest cached prefix of key, its last node ending exactly at the
        match (so locking it pins nothing unmatched). A tiered cache brings lower tiers' KV back
        into the pool first."""

    @abstractmethod
    def peek_prefix(self, key: PrefixKey) -> MatchResult:
        """A lookup for ordering only: the tree's shape is left as it is (the node may extend past
        the match) and no tier moves."""

    def snapshot_slot(self, node: TreeNode) -> int | None:
        """The state-pool slot of node's device snapshot (keeps_state_snapshots); None: none."""
        return None

    def kv_match(self, key: PrefixKey) -> MatchResult:
        """Where the KV of a just-inserted key ends (the cache manager repoints a request's row at
        it): peek_prefix's lookup, without any rule that stops a reusable match short (a hybrid
        model's match ends at a state snapshot)."""
        return self.peek_prefix(key)

    @abstractmethod
    def insert(self, key: PrefixKey, value: torch.Tensor) -> int:
        """Insert key -> value (KV slots). Returns how many leading tokens were already cached: the
        caller keeps (and frees) value[:returned], the cache owns the rest."""

    # --- locks and eviction --------------------------------------------------------
    @abstractmethod
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pin node and its ancestors; returns the change in evictable tokens (<= 0)."""

    @abstractmethod
    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unpin node and its ancestors; returns the change in evictable tokens (>= 0)."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free unlocked KV, least recently used first, until num_tokens are free or none is
        left."""

    @abstractmethod
    def flush(self, level: str = "l1") -> None:
        """Empty the cache (idle only; the caller clears the pools). Levels: FLUSH_LEVELS."""

    # --- sizes and introspection -----------------------------------------------------
    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def total_size(self) -> int:
        """KV slots the cache holds in the pool, counted by a walk (so it can catch drift)."""

    @abstractmethod
    def path_to(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        """Token ids and KV slots on the path from the root to node."""

    @abstractmethod
    def all_nodes(self) -> list[TreeNode]:
        """Every node but the root."""

    # --- prefetch from a slower tier (the hierarchical cache's storage) ----------------------
    def start_prefetch(self, key: PrefixKey) -> Prefetch | None:
        """Start reading the KV that continues key's cached prefix from a slower tier; None when
        there is nothing to read."""
        return None

    def has_prefetches(self) -> bool:
        return False

    def poll_prefetches(self) -> None:
        """Bring what the reads returned so far into the cache."""

    def check(self) -> str | None:
        """What is wrong with the cache's own invariants beyond the pool's (lower tiers), or
        None."""
        return None

    def info(self) -> dict:
        """Counters for /get_server_info and /metrics (empty: none beyond the sizes)."""
        return {}

    def wait_writes(self, timeout: float | None = None) -> bool:
        """Block until KV queued for storage is written (shutdown); False on timeout."""
        return True

    def close(self) -> None:
        """Stop background work (storage threads)."""
