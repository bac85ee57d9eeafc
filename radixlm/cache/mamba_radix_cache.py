"""MambaRadixCache: the radix tree of a hybrid model, whose nodes may carry state snapshots
(SGLang's name).

A hybrid model's prefix is reusable only where its state layers' states after that prefix were
kept: the attention KV of a longer match is no use without them. A node's `state` is a snapshot
slot of the MambaPool holding the states after the node's last token. `match_prefix` returns the
longest cached prefix that ends at a snapshot (the root: the empty prefix, zero states); the
attention KV past it is recomputed with the rest of the request (and freed as a duplicate when the
request inserts it). Snapshots enter through `attach_state` (the scheduler's state tracker:
scheduler/kv/state_tracker.py) and leave with their node, or alone when the snapshot slots run
short (`evict_states`: least recently used first, except where a lock ends). Leaves without a
snapshot hold KV nothing can reuse alone, so eviction takes them before leaves with one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import MatchResult, PrefixKey
from radixlm.cache.radix_cache import RadixCache
from radixlm.cache.tree_node import TreeNode, empty_indices, state_lru, touch, touch_state
from radixlm.radix_walk import walk

if TYPE_CHECKING:
    from radixlm.cache.memory_pool import TokenToKVPool
    from radixlm.cache.state_pool import MambaPool


class MambaRadixCache(RadixCache):
    def __init__(self, token_to_kv_pool: TokenToKVPool, state_pool: MambaPool):
        self.state_pool = state_pool
        super().__init__(token_to_kv_pool)

    # --- lookup ------------------------------------------------------------------
    def _match(self, key: PrefixKey, split: bool) -> MatchResult:
        """The deepest fully matched node with a snapshot (no split needed: a snapshot ends its
        node); only the path up to it counts as used."""
        best, path, values = self.root_node, [], []
        for child, _, m in walk(self.root_node, key.token_ids, child_key=key.child_key):
            if m < len(child.key) or child.value is None:
                break
            path.append(child)
            values.append(child.value)
            if child.state is not None:
                best = child
        n = 0
        if best is not self.root_node:
            n = path.index(best) + 1
            touch_state(best)
        touch(self.root_node)
        for node in path[:n]:
            touch(node)
        return MatchResult(torch.cat(values[:n]) if n else empty_indices(), best)

    def kv_match(self, key: PrefixKey) -> MatchResult:
        return RadixCache._match(self, key, split=False)

    # --- snapshots ---------------------------------------------------------------
    def attach_state(self, key: PrefixKey, alloc: Callable[[], int | None]) -> int | None:
        """Give the node ending at key (in the tree: just inserted) a snapshot slot from alloc(),
        splitting its edge if key ends inside it. -> the slot, or None when the node has a snapshot
        already or no slot was left (nothing changes then)."""
        at = self.locate(key)
        assert at is not None, "attach_state of a key the tree does not hold"
        node, m = at
        if m < len(node.key):
            node = self._split_node(node, m)
        if node is self.root_node or node.state is not None:
            return None
        slot = alloc()
        if slot is not None:
            node.state = slot
            touch_state(node)
        return slot

    def alloc_state(self) -> int | None:
        """A free snapshot slot, evicting the least recently used evictable snapshot if none
        is."""
        if not self.state_pool.available_snapshots():
            self.evict_states(1)
        return self.state_pool.alloc_snapshot()

    def evict_states(self, n: int) -> int:
        """Drop up to n evictable snapshots (snapshot_evictable), least recently used first (the
        nodes keep their KV)."""
        heap = [x for x in self.all_nodes() if x.state is not None and snapshot_evictable(x)]
        dropped = 0
        for node in heapq.nsmallest(n, heap, key=state_lru):
            self.state_pool.free_snapshot(node.state)
            node.state = None
            dropped += 1
        return dropped

    def snapshot_count(self) -> int:
        return sum(1 for n in self.all_nodes() if n.state is not None)

    # --- eviction ----------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """RadixCache's LRU eviction of unlocked leaves, leaves without a snapshot first."""
        if num_tokens <= 0:
            return 0
        order = lambda n: (n.state is not None, n.last_access_time, n.id)
        heap = [(order(n), n) for n in self.all_nodes() if self.evictable(n)]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, node = heapq.heappop(heap)
            if not self.evictable(node):
                continue
            parent = node.parent
            evicted += len(node.value)
            self._evict_node(node)
            if parent is not self.root_node and self.evictable(parent):
                heapq.heappush(heap, (order(parent), parent))
        return evicted

    def _evict_node(self, node: TreeNode) -> None:
        if node.state is not None:
            self.state_pool.free_snapshot(node.state)
            node.state = None
        super()._evict_node(node)

    def flush(self, level: str = "l1") -> None:
        super().flush(level)
        self.state_pool.clear()

    # --- introspection -------------------------------------------------------------
    def state_slots(self) -> list[int]:
        return [n.state for n in self.all_nodes() if n.state is not None]


def snapshot_evictable(node: TreeNode) -> bool:
    """A snapshot is pinned only on a node where a lock ends (a request's match or last node:
    its lock_ref exceeds its children's), not on the ancestors a lock passes through: a running
    request copied its match's snapshot into its row at admission (the copy queued before any
    reuse of the slot) and never reads the others, which a chat's running turns would otherwise
    keep from eviction while the waiting conversations' answers were evicted."""
    return node.lock_ref == sum(c.lock_ref for c in node.children.values())
