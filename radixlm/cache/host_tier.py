"""HostTier: the hierarchical cache's tier policy (SGLang's HiCache, on a CPU engine), the tier
part (tree_parts.CacheTier) of HiRadixCache and HiMambaRadixCache (hiradix_cache.py,
hi_mamba_radix_cache.py):

    L1  the device pool the model reads (TokenToKVPool), node.value
    L2  a larger host pool, maybe more compact (HostKVPool), node.host.value
    L3  a storage tier (storage_tier.py) of fixed-size chunks keyed by a hash chain from the model
        key; it outlives the process

The tree (radix_cache.py) calls its hooks: extend_match (L2 nodes that continue an L1 match are
loaded back into L1), on_inserted (write-through to L2 and L3) and evict_node (a node backed up in
L2 stays in the tree); its flush, check, info and the storage's prefetches are this tier's.

A node is in L1, or only in L2 (value None, host.value set). L1 nodes form a prefix-closed
subtree: a node in L1 has its parent in L1, so a device match is a walk that stops at the first
node outside L1. Locks pin L1 nodes only.

Moves:
  down  evicting from L1 keeps a node in L2 (backed up at insert by write_through, when hot by
        write_through_selective, at eviction by write_back); evicting from L2 drops it (write_back
        stores its chunks in L3 first). Without room in L2 a node is dropped.
  up    admission matches L1, then loads the L2 nodes that continue the match into fresh L1 slots.
        A request's arrival looks for the chunks that continue its L1+L2 match in L3 and reads them
        on background threads into L2 (start_prefetch / poll_prefetches); the request waits for
        them (SGLang's wait_complete prefetch policy).
See docs/architecture.md, "Hierarchical cache".
"""

from __future__ import annotations

import heapq
import time
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import MatchResult, PrefixKey
from radixlm.cache.hicache_io import HiCacheStats, Prefetch
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.kv_data import KVData
from radixlm.cache.kv_events import MEDIUM_CPU, MEDIUM_GPU
from radixlm.cache.payloads import HostSlots
from radixlm.cache.storage_tier import BaseStorageTier, NoStorageTier
from radixlm.cache.tree_node import TreeNode, touch
from radixlm.cache.tree_parts import CacheTier
from radixlm.radix_walk import walk

if TYPE_CHECKING:
    from radixlm.cache.radix_cache import RadixCache

# write_through_selective backs a node up once it has been matched this often (SGLang's threshold).
SELECTIVE_HITS = 2


class HostTier(CacheTier):
    PAYLOAD = HostSlots

    def __init__(
        self,
        host_pool: HostKVPool,
        write_policy: str = "write_through",
        storage_tier: BaseStorageTier | None = None,
        stats: HiCacheStats | None = None,
    ):
        self.host_pool = host_pool
        self.write_policy = write_policy
        self.stats = stats or HiCacheStats()  # shared with the storage backend's error counts
        self.storage_tier = storage_tier or NoStorageTier()

    def bind(self, tree: RadixCache) -> None:
        self.tree = tree

    def reset(self) -> None:
        self.host_pool.clear()

    @property
    def prefetches(self) -> list[Prefetch]:
        return self.storage_tier.prefetches

    def has_prefetches(self) -> bool:
        return bool(self.storage_tier.prefetches)

    # --- admission: L1 match + L2 load-back --------------------------------------
    def extend_match(self, key: PrefixKey, l1: MatchResult) -> MatchResult:
        """The longest prefix in L1 or L2, all of it in L1 afterwards (loads L2 nodes back into
        fresh L1 slots); only the L1 part when L1 has no room for the rest."""
        tree = self.tree
        indices, node = l1
        host_nodes = self._host_continuation(node, key, len(indices))
        self.count_hits(node, host_nodes)
        need = sum(len(h.key) for h in host_nodes)
        if need == 0:
            return MatchResult(indices, node)
        t0 = time.perf_counter()
        for h in host_nodes:
            h.host.lock += 1  # L1 eviction below may need L2 room: keep these
        tree.inc_lock_ref(node)  # and keep the L1 prefix
        try:
            slots = alloc_from(tree.token_to_kv_pool, tree.evict, need)
        finally:
            tree.dec_lock_ref(node)
            for h in host_nodes:
                h.host.lock -= 1
        if slots is None:
            return MatchResult(indices, node)
        self.load_nodes(host_nodes, slots)
        self.stats.count("l2_hit_tokens", need)
        self.stats.count("l2_loads")
        self.stats.count("bytes_l2_to_l1", need * self.host_pool.bytes_per_token)
        self.stats.count("l2_load_seconds", time.perf_counter() - t0)
        return MatchResult(torch.cat([indices, slots]), host_nodes[-1])

    def load_nodes(self, host_nodes: list[TreeNode], slots: torch.Tensor) -> None:
        """L2-only nodes back into L1, in the fresh L1 slots `slots` (their lengths summed)."""
        off, tree = 0, self.tree
        for h in host_nodes:
            n = len(h.key)
            h.value = slots[off : off + n]
            self.host_pool.load_into(tree.token_to_kv_pool, h.host.value, h.value)
            tree.evictable_size_ += n
            off += n
        tree.events.stored(host_nodes, MEDIUM_GPU)

    def _host_continuation(self, node: TreeNode, key: PrefixKey, pos: int) -> list[TreeNode]:
        """The L2-only nodes below node along key[pos:] (the last one split to end at the match)."""
        out = []
        for child, _, m in walk(node, key.token_ids, pos, key.child_key):
            if child.value is not None:
                break
            if m < len(child.key):
                child = self.tree._split_node(child, m)
            touch(child)
            out.append(child)
        return out

    def count_hits(self, node: TreeNode, host_nodes: list[TreeNode]) -> None:
        """write_through_selective: count the matches through node's path (and host_nodes); back
        up the nodes that got hot."""
        if self.write_policy != "write_through_selective":
            return
        hot = None
        for n in host_nodes:
            n.host.hits += 1
        while node is not self.tree.root_node:
            node.host.hits += 1
            if node.host.hits >= SELECTIVE_HITS and node.host.value is None:
                self.backup(node)
                hot = hot or node
            node = node.parent
        if hot is not None:
            self._store_path(hot)

    def match_len(self, key: PrefixKey) -> int:
        """Tokens of key's prefix held in L1 or L2 (a read-only walk)."""
        return max(
            (
                pos + m
                for _, pos, m in walk(self.tree.root_node, key.token_ids, child_key=key.child_key)
            ),
            default=0,
        )

    # --- insert: write-through ------------------------------------------------------
    def on_inserted(self, new_nodes: list[TreeNode], last: TreeNode) -> None:
        if self.write_policy == "write_through":
            for n in new_nodes:
                self.backup(n)
            self._store_path(last)

    def insert_host(self, key: PrefixKey, start: int, chunks: list[KVData]) -> int:
        """Hang KV read from L3 (consecutive chunks covering key[start:]) below the tree's match of
        key, in L2. Returns the tokens added (0 when the tree no longer reaches `start`)."""
        tree = self.tree
        ids, node, pos = key.token_ids, tree.root_node, 0
        for child, at, m in walk(tree.root_node, ids, child_key=key.child_key):
            if m < len(child.key):
                child = tree._split_node(child, m)
            node, pos = child, at + m
        new = len(ids) - pos
        if pos < start or new <= 0:
            return 0
        node.host.lock += 1  # host eviction for room must not drop the node we hang below
        try:
            host = self._alloc_host(new)
        finally:
            node.host.lock -= 1
        if host is None:
            return 0
        at = start  # token position of the chunk's first token
        for data in chunks:  # chunk by chunk: concatenating them first costs a slow copy
            lo, hi = max(pos, at), at + data.num_tokens
            if lo < hi:
                part = KVData(
                    *[
                        t[:, lo - at :] if t is not None else None
                        for t in (data.k, data.v, data.k_scale, data.v_scale)
                    ]
                )
                self.host_pool.set(host[lo - pos : hi - pos], part)
            at = hi
        leaf = TreeNode(ids[pos:], None, key.namespace, tree.PARTS)
        leaf.value, leaf.host.value, leaf.parent = None, host, node
        node.children[leaf.lookup_key()] = leaf
        tree.events.stored([leaf], MEDIUM_CPU)
        return new

    # --- L1 eviction: down to L2 -------------------------------------------------
    def evict_node(self, node: TreeNode) -> None:
        """The node stays in the tree, in L2, when it has (or now gets) a copy there."""
        n = len(node.value)
        if node.host.value is None and self.write_policy != "write_through_selective":
            # write_back (write_through backed it up at insert, unless L2 was full)
            self.backup(node)
        self.tree._free_l1(node)
        node.value = None
        if node.host.value is not None:
            self.stats.count("l1_evicted_tokens", n)
        else:
            self._drop_subtree(node)

    def _drop_subtree(self, node: TreeNode) -> None:
        """Remove an L1-evicted node without a backup and its L2-only subtree from the tree."""
        events, stack = self.tree.events, [node]
        for n in self._subtree(node):  # while still linked: their block hashes need the path
            if n.host.value is not None:
                events.removed(n, MEDIUM_CPU)
        self.tree._unlink(node)  # tells the snapshot part about node; the loop about the rest
        while stack:
            n = stack.pop()
            assert n.value is None and n.host.lock == 0, n
            if n is not node:
                self.tree.snapshots.leave_tree(n)
                events.forget(n)
            if n.host.value is not None:
                self.host_pool.free(n.host.value)
                n.host.value = None
            self.stats.count("dropped_tokens", len(n.key))
            stack.extend(n.children.values())
            n.parent = None

    @staticmethod
    def _subtree(node: TreeNode) -> list[TreeNode]:
        out, stack = [], [node]
        while stack:
            out.append(stack.pop())
            stack.extend(out[-1].children.values())
        return out

    # --- L2 -------------------------------------------------------------------------
    def backup(self, node: TreeNode) -> bool:
        """Copy an L1 node's KV to L2 (if not there yet). False: no room in L2."""
        if node.host.value is not None:
            return True
        node.host.lock += 1
        try:
            host = self._alloc_host(len(node.value))
        finally:
            node.host.lock -= 1
        if host is None:
            return False
        self.host_pool.backup_from(self.tree.token_to_kv_pool, node.value, host)
        node.host.value = host
        self.tree.events.stored([node], MEDIUM_CPU)
        self.stats.count("bytes_l1_to_l2", len(host) * self.host_pool.bytes_per_token)
        return True

    def _alloc_host(self, need: int) -> torch.Tensor | None:
        return alloc_from(self.host_pool, self.evict_host, need)

    def evict_host(self, num_tokens: int) -> int:
        """Free L2 slots, least recently used first: L2-only leaves (gone from the tree; stored in
        L3 first under write_back) and backups of L1 nodes (the node stays, in L1 only)."""

        def candidate(n: TreeNode) -> bool:
            if n.host.value is None or n.host.lock > 0:
                return False
            return n.value is not None or not n.children

        tree = self.tree
        heap = [n for n in tree.all_nodes() if candidate(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)
            if not candidate(node) or node.parent is None:
                continue
            n = len(node.host.value)
            if node.value is None and self.write_policy == "write_back":
                self._store_path(node)
            tree.events.removed(node, MEDIUM_CPU)
            self.host_pool.free(node.host.value)
            node.host.value = None
            freed += n
            self.stats.count("l2_evicted_tokens", n)
            if node.value is None:  # L2-only leaf: it leaves the tree
                parent = node.parent
                tree._unlink(node)
                self.stats.count("dropped_tokens", n)
                if parent is not tree.root_node and candidate(parent):
                    heapq.heappush(heap, parent)
        return freed

    # --- L3 ---------------------------------------------------------------------
    def _path(self, node: TreeNode) -> list[TreeNode]:
        out = []
        while node is not self.tree.root_node:
            out.append(node)
            node = node.parent
        return out[::-1]

    def _store_path(self, node: TreeNode) -> None:
        """Queue the full chunks of the path to node that L3 lacks (read from L1 or L2 now)."""
        path = self._path(node)
        self.storage_tier.store(
            node.namespace,
            [t for n in path for t in n.key],
            lambda lo, hi: self._gather(path, lo, hi),
        )

    def _gather(self, path: list[TreeNode], lo: int, hi: int) -> KVData:
        """KV of tokens [lo, hi) of a path, from whichever tier holds each node, as L2's type."""
        parts, pos = [], 0
        for n in path:
            a, b = max(lo, pos), min(hi, pos + len(n.key))
            if a < b:
                if n.value is not None:
                    parts.append(
                        HostKVPool.read_device(
                            self.tree.token_to_kv_pool,
                            n.value[a - pos : b - pos],
                            self.host_pool.dtype,
                        )
                    )
                else:
                    parts.append(self.host_pool.get(n.host.value[a - pos : b - pos]))
            pos += len(n.key)
            if pos >= hi:
                break
        return KVData.cat(parts)

    def start_prefetch(self, key: PrefixKey) -> Prefetch | None:
        """Start reading the L3 chunks that continue key's L1+L2 match; None if there are none."""
        return self.storage_tier.start_prefetch(key.namespace, key.token_ids, self.match_len(key))

    def poll_prefetches(self) -> None:
        """Hang the chunks read so far into L2 (storage_tier.StorageTier.poll)."""
        self.storage_tier.poll(
            lambda ns, ids, start, chunks: self.insert_host(PrefixKey(ids, ns), start, chunks)
        )

    # --- flush, introspection ----------------------------------------------------
    def flush(self, level: str) -> None:
        """Empty L1 (nodes move down as eviction moves them); level "l2" empties L2 too, "l3" also
        the storage. Only while no request holds KV."""
        tree = self.tree
        assert tree.protected_size_ == 0, "flush with requests holding KV"
        if level == "l1":
            tree.evict(tree.evictable_size_)
            return
        tree.reset()
        if level == "l3":
            self.storage_tier.clear()

    def host_size(self) -> int:
        return self.host_pool.size - self.host_pool.available_size()

    def check(self) -> str | None:
        """The tier invariants (what is wrong, or None): L1 prefix-closed, L2-only nodes unlocked
        and backed, every L2 slot owned exactly once."""
        parts, root = [self.host_pool.free_slots], self.tree.root_node
        for n in self.tree.all_nodes():
            if n.value is not None and n.parent is not root and n.parent.value is None:
                return f"{n} is in L1 below an L2-only node"
            if n.value is None and (n.host.value is None or n.lock_ref):
                return f"{n} is in no tier or locked outside L1"
            if n.host.lock:
                return f"{n} pinned in L2 outside a load"
            if n.host.value is not None:
                if len(n.host.value) != len(n.key):
                    return f"{n}: {len(n.host.value)} L2 slots for {len(n.key)} tokens"
                parts.append(n.host.value)
        counts = torch.bincount(torch.cat(parts), minlength=self.host_pool.size + 1)
        if (
            counts[0] != 0
            or counts.numel() != self.host_pool.size + 1
            or bool((counts[1:] != 1).any())
        ):
            return "an L2 slot without exactly one owner"
        return None

    def info(self) -> dict:
        return {
            **self.stats.as_dict(),
            "l2_size_tokens": self.host_pool.size,
            "l2_used_tokens": self.host_size(),
            "write_policy": self.write_policy,
            **self.storage_tier.info(),
        }

    def wait_writes(self, timeout: float | None) -> bool:
        return self.storage_tier.wait_writes(timeout)

    def close(self) -> None:
        self.storage_tier.close()


def alloc_from(pool, evict, need: int) -> torch.Tensor | None:
    """`need` slots of a tier's pool, evicting from that tier first when it is short."""
    short = need - pool.available_size()
    if short > 0:
        evict(short)
    return pool.alloc(need)
