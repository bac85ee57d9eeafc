"""RadixCache: a radix tree from token-id prefixes to the KV slots that hold them.

Page size 1: every token owns one slot in the TokenToKVPool. A node's `key` is the run of token
ids on its edge and its `value` the int64 slot indices of those tokens, so the KV of a prefix is
the concatenation of the values on its path from the root. Keys carry a namespace (PrefixKey):
a child is looked up by (namespace, first token), so namespaces never share a node.

Nodes that a running request still reads are pinned by `lock_ref` (counted on the whole path,
since a request needs every ancestor too). Everything else is evictable, leaves first, least
recently used first. Accounting is kept incrementally: evictable_size + protected_size ==
total_size at all times.

The descent is radix_walk.walk, shared with every tree of the project. The tree is composed with
two parts (tree_parts.py) whose hooks it calls: a tier policy (DeviceOnlyTier here; HostTier:
HiRadixCache's host memory and storage) for what happens after an L1 match, after an insert and
when a node leaves L1; and state snapshots (NoSnapshots here; DeviceSnapshots, HostSnapshots: a
hybrid model's) for where a match may end, which leaves go first and what a node leaving L1 or
the tree does with its snapshot. The named caches (HiRadixCache, MambaRadixCache,
HiMambaRadixCache) are this tree with their parts. What a part keeps per node is a payload of one
of the tree's PARTS (payloads.py), never a field of its own. See docs/architecture.md,
"KV ownership".
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import TYPE_CHECKING, ClassVar

import torch

from radixlm.cache.base_prefix_cache import (
    BasePrefixCache,
    CacheCapabilities,
    MatchResult,
    PrefixKey,
)
from radixlm.cache.kv_events import MEDIUM_GPU
from radixlm.cache.tree_node import TreeNode, empty_indices, touch
from radixlm.cache.tree_parts import CacheTier, SnapshotPart
from radixlm.radix_walk import walk

if TYPE_CHECKING:
    from collections.abc import Callable

    from radixlm.cache.hicache_io import Prefetch
    from radixlm.cache.memory_pool import TokenToKVPool
    from radixlm.cache.payloads import CachePart


class RadixCache(BasePrefixCache):
    def __init__(
        self,
        token_to_kv_pool: TokenToKVPool,
        tier: CacheTier | None = None,
        snapshots: SnapshotPart | None = None,
    ):
        self.token_to_kv_pool = token_to_kv_pool
        self.tier = DeviceOnlyTier() if tier is None else tier
        self.snapshots = NoSnapshots() if snapshots is None else snapshots
        # The nodes carry the payloads of exactly the parts that use them.
        payloads = {self.tier.PAYLOAD, self.snapshots.PAYLOAD} - {None}
        assert payloads == {p for p in self.PARTS if p.NODE_SLOT}, (self.PARTS, payloads)
        self.tier.bind(self)
        self.snapshots.bind(self)
        self.reset()

    # The parts beyond the plain tree (payloads.py): its nodes' payloads, its capabilities.
    PARTS: ClassVar[tuple[type[CachePart], ...]] = ()

    def capabilities(self) -> CacheCapabilities:
        return CacheCapabilities.of(self.PARTS)

    def reset(self) -> None:
        """Drop the whole tree. Slots are not freed here: the caller clears the pools."""
        self.root_node = TreeNode(parts=self.PARTS)
        # The root is never evicted and locking stops below it; a permanent ref keeps
        # it out of every "lock_ref == 0" test.
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.tier.reset()
        self.snapshots.reset()
        self.events.cleared()

    # --- lookup / insert ---------------------------------------------------------
    def match_prefix(self, key: PrefixKey) -> MatchResult:
        """Longest cached prefix of key: its KV indices and the node where it ends. A match that
        stops inside an edge splits that node, so the node ends exactly at the match. Where it may
        end and what comes back from lower tiers: the snapshot part's and the tier's hooks."""
        return self.snapshots.match(key, admit=True)

    def peek_prefix(self, key: PrefixKey) -> MatchResult:
        """As match_prefix without splitting or loading: the node is the deepest one the match
        reached, which may extend past the match."""
        return self.snapshots.match(key, admit=False)

    def kv_match(self, key: PrefixKey) -> MatchResult:
        return RadixCache._match(self, key, split=False)

    def _match(self, key: PrefixKey, split: bool) -> MatchResult:
        """The match in L1 alone."""
        node = self.root_node
        if not key.token_ids:
            return MatchResult(empty_indices(), node)
        touch(node)
        values: list[torch.Tensor] = []
        for child, _, m in walk(node, key.token_ids, child_key=key.child_key):
            if child.value is None:  # the device match ends where the KV left L1
                break
            touch(child)
            if m < len(child.key):
                if split:
                    child = self._split_node(child, m)
                    values.append(child.value)
                else:
                    values.append(child.value[:m])
                node = child
                break
            values.append(child.value)
            node = child
        return MatchResult(torch.cat(values) if values else empty_indices(), node)

    def insert(self, key: PrefixKey, value: torch.Tensor) -> int:
        """Insert key -> value. Returns how many leading tokens were already cached (in L1): the
        tree keeps its own slots for them and the caller owns (and must free) value[:returned].
        A node whose KV left L1 takes the caller's slots back (hierarchical cache)."""
        ids = key.token_ids
        assert len(ids) == len(value), f"key/value length mismatch: {len(ids)} vs {len(value)}"
        node, end, shared, new_nodes = self.root_node, 0, 0, []
        touch(node)
        for child, pos, m in walk(node, ids, child_key=key.child_key):
            touch(child)
            if m < len(child.key):
                child = self._split_node(child, m)
            child.insert_count += 1
            if child.value is None:
                child.value = value[pos : pos + m].clone()
                self.evictable_size_ += m
                new_nodes.append(child)
            else:
                assert not new_nodes, "an L1 node below one outside L1"
                shared += m
            node, end = child, pos + m
        if end < len(ids):  # nothing cached past this point: the rest is a new (unlocked) leaf
            leaf = TreeNode(ids[end:], value[end:].clone(), key.namespace, self.PARTS)
            leaf.insert_count = 1
            leaf.parent = node
            node.children[leaf.lookup_key()] = leaf
            self.evictable_size_ += len(leaf.key)
            new_nodes.append(leaf)
            node = leaf
        if new_nodes:
            self.events.stored(new_nodes, MEDIUM_GPU)
            self.tier.on_inserted(new_nodes, node)
        return shared

    def locate(self, key: PrefixKey, node: TreeNode | None = None) -> tuple[TreeNode, int] | None:
        """Where key (read from node, default the root) ends in the tree: (n, m), the key ending m
        tokens into n's edge (m == len(n.key): at n); None when key leaves the tree. Read-only: no
        split, no access-time update."""
        node = node or self.root_node
        ids = key.token_ids
        if not ids:
            return node, len(node.key)
        for child, pos, m in walk(node, ids, child_key=key.child_key):
            if pos + m == len(ids):
                return child, m
            if m < len(child.key):
                return None
        return None  # no child continues the key

    @staticmethod
    def branches(node: TreeNode, namespace: Hashable = None) -> list[TreeNode]:
        """node's children in `namespace`, the most taken first (insert_count), the most recently
        used on a tie."""
        kids = [c for c in node.children.values() if c.namespace == namespace]
        return sorted(kids, key=lambda c: (c.insert_count, c.last_access_time), reverse=True)

    def continuation(self, key: PrefixKey, k: int, node: TreeNode | None = None) -> list[int]:
        """Up to k cached tokens that follow key (read from node, default the root), along the most
        taken children (branches); [] when key leaves the tree. Read-only (a draft is not a use)."""
        at = self.locate(key, node) if k > 0 else None
        if at is None:
            return []
        node, m = at
        out = list(node.key[m : m + k])
        while len(out) < k and (kids := self.branches(node, key.namespace)):
            node = kids[0]
            out += node.key[: k - len(out)]
        return out

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut child's edge after split_len tokens; return the new upper node.

        The upper half inherits child's lock_ref: every lock that pinned child pinned the whole
        edge, so the sizes (evictable/protected) do not change."""
        upper = TreeNode(child.key[:split_len], None, child.namespace)
        upper.parent = child.parent
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        upper.insert_count = child.insert_count
        if child.value is not None:
            upper.value, child.value = child.value[:split_len], child.value[split_len:]
        else:
            upper.value = None
        child.split_payloads(upper, split_len)
        upper.parent.children[upper.lookup_key()] = upper
        child.key = child.key[split_len:]
        child.parent = upper
        upper.children = {child.lookup_key(): child}
        return upper

    def flush(self, level: str = "l1") -> None:
        """Empty the cache (idle only; the caller clears the pools): the tier's flush, with the
        snapshot part's work around it."""
        self.snapshots.before_flush()
        self.tier.flush(level)
        self.snapshots.after_flush()

    # --- eviction and locking ----------------------------------------------------
    @staticmethod
    def evictable(node: TreeNode) -> bool:
        """In L1, unlocked, and no child in L1 (a leaf, without the hierarchical cache)."""
        return (
            node.value is not None
            and node.lock_ref == 0
            and all(c.value is None for c in node.children.values())
        )

    def evict(self, num_tokens: int) -> int:
        """Free evictable nodes in the snapshot part's order (least recently used first) until
        num_tokens are freed or nothing is evictable."""
        if num_tokens <= 0:
            return 0
        order = self.snapshots.evict_order
        heap = [(order(n), n) for n in self.all_nodes() if self.evictable(n)]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, node = heapq.heappop(heap)
            if not self.evictable(node):  # changed since it was pushed
                continue
            parent = node.parent
            evicted += len(node.value)
            self._evict_node(node)
            # A parent left without an L1 child and unlocked is now evictable itself.
            if parent is not self.root_node and self.evictable(parent):
                heapq.heappush(heap, (order(parent), parent))
        return evicted

    def _evict_node(self, node: TreeNode) -> None:
        """An evictable node leaves L1: its snapshot first, then its KV (the tier's call)."""
        self.events.removed(node, MEDIUM_GPU)
        self.snapshots.leave_l1(node)
        self.tier.evict_node(node)

    def _free_l1(self, node: TreeNode) -> None:
        self.token_to_kv_pool.free(node.value)
        self.evictable_size_ -= len(node.value)

    def _unlink(self, node: TreeNode) -> None:
        """node leaves the tree (its snapshot part told first)."""
        self.snapshots.leave_tree(node)
        del node.parent.children[node.lookup_key()]
        node.parent = None
        self.events.forget(node)

    def inc_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
                delta -= len(node.value)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            assert node.lock_ref > 0, f"unbalanced dec_lock_ref on {node}"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
                delta += len(node.value)
            node.lock_ref -= 1
            node = node.parent
        return delta

    # --- sizes and debugging -----------------------------------------------------
    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        return sum(len(n.value) for n in self.all_nodes() if n.value is not None)

    def path_to(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        keys, values = [], []
        while node is not self.root_node:
            keys.append(node.key)
            values.append(node.value)
            node = node.parent
        ids = [t for k in reversed(keys) for t in k]
        return ids, torch.cat(values[::-1]) if values else empty_indices()

    def all_nodes(self) -> list[TreeNode]:
        nodes, stack = [], list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    # --- the parts' calls (tree_parts.py) ------------------------------------------
    def snapshot_slot(self, node: TreeNode) -> int | None:
        return self.snapshots.snapshot_slot(node)

    def attach_state(
        self, key: PrefixKey, alloc: Callable[[], int | None], from_answer: bool = False
    ) -> int | None:
        return self.snapshots.attach_state(key, alloc, from_answer)

    def alloc_state(self, superseded_only: bool = False) -> int | None:
        return self.snapshots.alloc_state(superseded_only)

    def evict_states(self, n: int, superseded_only: bool = False) -> int:
        return self.snapshots.evict_states(n, superseded_only)

    def snapshot_count(self) -> int:
        return self.snapshots.snapshot_count()

    def state_slots(self) -> list[int]:
        return self.snapshots.state_slots()

    def start_prefetch(self, key: PrefixKey) -> Prefetch | None:
        return self.tier.start_prefetch(key)

    def has_prefetches(self) -> bool:
        return self.tier.has_prefetches()

    def poll_prefetches(self) -> None:
        self.tier.poll_prefetches()

    def check(self) -> str | None:
        return self.tier.check() or self.snapshots.check()

    def info(self) -> dict:
        return {**self.tier.info(), **self.snapshots.info()}

    def wait_writes(self, timeout: float | None = None) -> bool:
        return self.tier.wait_writes(timeout)

    def close(self) -> None:
        self.tier.close()

    def pretty_print(self) -> None:
        def visit(node: TreeNode, indent: int) -> None:
            for child in node.children.values():
                where = child.value.tolist() if child.value is not None else "L2"
                print(" " * indent + f"{child.key} -> {where} lock_ref={child.lock_ref}")
                visit(child, indent + 2)

        visit(self.root_node, 0)
        print(
            f"total={self.total_size()} evictable={self.evictable_size()}"
            f" protected={self.protected_size()}"
        )


class DeviceOnlyTier(CacheTier):
    """No tier below the device pool: KV that leaves L1 leaves the tree."""

    def bind(self, tree: RadixCache) -> None:
        self.tree = tree

    def reset(self) -> None:
        pass

    def extend_match(self, key: PrefixKey, l1: MatchResult) -> MatchResult:
        return l1

    def on_inserted(self, new_nodes: list[TreeNode], last: TreeNode) -> None:
        pass

    def evict_node(self, node: TreeNode) -> None:
        self.tree._free_l1(node)
        self.tree._unlink(node)

    def flush(self, level: str) -> None:
        self.tree.reset()  # drop the whole tree

    def check(self) -> str | None:
        return None

    def info(self) -> dict:
        return {}

    def start_prefetch(self, key: PrefixKey) -> Prefetch | None:
        return None

    def has_prefetches(self) -> bool:
        return False

    def poll_prefetches(self) -> None:
        pass

    def wait_writes(self, timeout: float | None) -> bool:
        return True

    def close(self) -> None:
        pass


class NoSnapshots(SnapshotPart):
    """No state snapshots: a match ends where the tree's KV does; the state calls find none."""

    def bind(self, tree: RadixCache) -> None:
        self.tree = tree

    def reset(self) -> None:
        pass

    def match(self, key: PrefixKey, admit: bool) -> MatchResult:
        l1 = self.tree._match(key, split=admit)
        return self.tree.tier.extend_match(key, l1) if admit else l1

    def evict_order(self, node: TreeNode) -> int:
        return node.last_access_time

    def leave_l1(self, node: TreeNode) -> None:
        pass

    def leave_tree(self, node: TreeNode) -> None:
        pass

    def before_flush(self) -> None:
        pass

    def after_flush(self) -> None:
        pass

    def check(self) -> str | None:
        return None

    def info(self) -> dict:
        return {}

    def snapshot_slot(self, node: TreeNode) -> int | None:
        return None

    def attach_state(
        self, key: PrefixKey, alloc: Callable[[], int | None], from_answer: bool
    ) -> int | None:
        return None

    def alloc_state(self, superseded_only: bool) -> int | None:
        return None

    def evict_states(self, n: int, superseded_only: bool) -> int:
        return 0

    def snapshot_count(self) -> int:
        return 0

    def state_slots(self) -> list[int]:
        return []
