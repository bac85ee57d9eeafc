"""HiMambaRadixCache: the hierarchical cache of a hybrid model (SGLang's name): the tree
(radix_cache.py) composed with the HostTier (host_tier.py: L1 and L2 tiers of KV) and HostSnapshots,
this module's snapshot part: MambaRadixCache's DeviceSnapshots with a host tier of their own
(HostStatePool, host_state_pool.py). No storage tier (L3): snapshots have none, so
--hicache-storage-backend is refused for hybrids (factory.py: prefix_cache_kind).

A node's snapshot payload (payloads.StateSnapshot) may hold `slot` (a device snapshot slot of the
MambaPool) and/or `host_slot` (a host snapshot slot), both the state layers' states after the
node's last token. A device snapshot is
only on a node in L1; a host snapshot on any node of the tree.

    down  a device snapshot that leaves (evict_states' LRU, or its node evicted from L1 into L2)
          is backed up to the host first unless a copy is there (write-back); without host room
          the least recently used host snapshots of unlocked nodes are dropped for it, and failing
          that the snapshot is dropped. A node that leaves the tree (L2 eviction, a drop without
          an L2 copy) frees its host snapshot.
    up    match_prefix: the longest prefix over L1 and L2 that ends at a node with a device or a
          readable host snapshot. Its L2 KV is loaded into L1 (as HiRadixCache does) and, when the
          snapshot is on the host only, a device slot is allocated (alloc_state, which may move
          other snapshots down, never the matched path's) and the host copy is queued into it.
          Without room for either, the match falls back to the deepest snapshot already on the
          device (or the root).

Host snapshots are checked before they are used: a copy whose checksum no longer matches is
dropped, counted (HiCacheStats.state_corrupt) and logged, and the match falls back to the next
shallower snapshot: a miss for that part of the prefix, never a wrong state.

Every state copy, host ones included, is queued in the MambaPool's copy queue and runs on the
forward's thread in order (state_pool.py), so the scheduler never reads a device snapshot a
queued copy has yet to write. kv_match (the cache manager's KV-only match) and peek_prefix are
DeviceSnapshots', on L1.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import MatchResult, PrefixKey
from radixlm.cache.hicache_io import HiCacheStats
from radixlm.cache.hiradix_cache import HiRadixCache, host_kv_size, host_slots
from radixlm.cache.host_pool import HostKVPool, host_dtype_for
from radixlm.cache.host_state_pool import HostStatePool
from radixlm.cache.host_tier import HostTier, alloc_from
from radixlm.cache.kv_events import MEDIUM_CPU_STATE, MEDIUM_GPU_STATE
from radixlm.cache.mamba_radix_cache import (
    DeviceSnapshots,
    evictable_snapshots,
    snapshot_evictable,
)
from radixlm.cache.payloads import HostSlots, StateSnapshot
from radixlm.cache.radix_cache import RadixCache
from radixlm.cache.tree_node import TreeNode, empty_indices, state_lru, touch, touch_state
from radixlm.radix_walk import walk

if TYPE_CHECKING:
    from radixlm.cache.hicache_config import HiCacheConfig
    from radixlm.cache.memory_pool import TokenToKVPool
    from radixlm.cache.state_pool import MambaPool

logger = logging.getLogger(__name__)


class HiMambaRadixCache(HiRadixCache):
    """The tree with a HostTier (HiRadixCache) and HostSnapshots."""

    PARTS = (HostSlots, StateSnapshot)  # a host tier of the snapshots too: no other capability

    def __init__(
        self,
        token_to_kv_pool: TokenToKVPool,
        state_pool: MambaPool,
        host_pool: HostKVPool,
        host_states: HostStatePool,
        write_policy: str = "write_through",
        stats: HiCacheStats | None = None,
    ):
        snapshots = HostSnapshots(state_pool, host_states)
        super().__init__(token_to_kv_pool, host_pool, write_policy, None, stats, snapshots)
        self.host_snapshots = snapshots

    @property
    def state_pool(self) -> MambaPool:
        return self.host_snapshots.state_pool

    @property
    def host_states(self) -> HostStatePool:
        return self.host_snapshots.host_states

    def host_snapshot_count(self) -> int:
        return self.host_snapshots.host_snapshot_count()

    def _evict_host_states(self, n: int) -> int:
        return self.host_snapshots.evict_host_states(n)


class HostSnapshots(DeviceSnapshots):
    """DeviceSnapshots with host copies (node.snapshot.host_slot), over a HostTier."""

    def __init__(self, state_pool: MambaPool, host_states: HostStatePool):
        super().__init__(state_pool)
        self.host_states = host_states
        state_pool.host = host_states  # queued host copies run in MambaPool.apply_copies

    def bind(self, tree: RadixCache) -> None:
        assert isinstance(tree.tier, HostTier), "host snapshots follow their nodes into L2"
        self.tree, self.tier = tree, tree.tier

    def reset(self) -> None:
        self.host_states.clear()

    # --- admission ---------------------------------------------------------------
    def match(self, key: PrefixKey, admit: bool) -> MatchResult:
        if not admit:  # peek_prefix: on L1, nothing moves
            return super().match(key, admit)
        root = self.tree.root_node
        if not key.token_ids:
            return MatchResult(empty_indices(), root)
        path = []  # fully matched nodes, any tier (a snapshot ends its node: no split)
        for child, _, m in walk(root, key.token_ids, child_key=key.child_key):
            if m < len(child.key):
                break
            path.append(child)
        loadable = True  # until bringing a host snapshot back found no room
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            if node.snapshot.slot is None:
                if not (loadable and self._readable(node)):
                    continue
                loadable = self._load(path[: i + 1])
                if not loadable:
                    continue
            return self._use(path[: i + 1])
        return self._use([])

    def _readable(self, node: TreeNode) -> bool:
        """node's host snapshot, if any, has been written and is intact (a damaged one goes)."""
        if node.snapshot.host_slot is None:
            return False
        ok = self.host_states.verify(node.snapshot.host_slot)
        if ok is False:
            self._free_host_state(node)
            self.tier.stats.count("state_corrupt")
            logger.warning(
                "hicache: a host state snapshot failed its checksum; dropped, its prefix is"
                " recomputed (%d so far)",
                self.tier.stats.state_corrupt,
            )
        return bool(ok)

    def _load(self, path: list[TreeNode]) -> bool:
        """Bring path (ending at a node whose snapshot is on the host only) into L1 and its
        snapshot onto the device. False, with nothing changed but eviction, without room."""
        tree, tier, stats = self.tree, self.tier, self.tier.stats
        target = path[-1]
        host_nodes = [n for n in path if n.value is None]  # a suffix: L1 is prefix-closed
        l1_end = path[len(path) - len(host_nodes) - 1] if len(host_nodes) < len(path) else None
        need = sum(len(n.key) for n in host_nodes)
        t0 = time.perf_counter()
        pinned = [*host_nodes, target] if target.value is not None else host_nodes
        for n in pinned:  # eviction below must keep these in L2 and the target's snapshot
            n.host.lock += 1
        if l1_end is not None:
            tree.inc_lock_ref(l1_end)  # and the L1 part, device snapshots included
        slots = slot = None
        try:
            pool = tree.token_to_kv_pool
            slots = alloc_from(pool, tree.evict, need) if need else empty_indices()
            if slots is not None:
                slot = self.alloc_state(False)
        finally:
            if l1_end is not None:
                tree.dec_lock_ref(l1_end)
            for n in pinned:
                n.host.lock -= 1
        if slot is None:
            if slots is not None and need:
                tree.token_to_kv_pool.free(slots)
            return False
        tier.load_nodes(host_nodes, slots)
        target.snapshot.slot = slot
        tree.events.snapshot_stored(target, MEDIUM_GPU_STATE)
        self.state_pool.queue_copy(self.state_pool.host_index(target.snapshot.host_slot), slot)
        stats.count("state_l2_loads")
        moved = need * tier.host_pool.bytes_per_token + self.state_pool.state_bytes
        stats.count("bytes_l2_to_l1", moved)
        if need:
            stats.count("l2_hit_tokens", need)
            stats.count("l2_loads")
        stats.count("l2_load_seconds", time.perf_counter() - t0)
        return True

    def _use(self, path: list[TreeNode]) -> MatchResult:
        touch(self.tree.root_node)
        for n in path:
            touch(n)
        if not path:
            return MatchResult(empty_indices(), self.tree.root_node)
        touch_state(path[-1])
        path[-1].snapshot.from_answer = False  # a prompt continues it (DeviceSnapshots.match)
        self.tier.count_hits(path[-1], [])
        return MatchResult(torch.cat([n.value for n in path]), path[-1])

    # --- snapshots down ------------------------------------------------------------
    def evict_states(self, n: int, superseded_only: bool) -> int:
        """Move up to n evictable device snapshots (snapshot_evictable) to the host in eviction
        order (snapshot_order; the nodes keep their KV)."""
        nodes = evictable_snapshots(self.tree.all_nodes(), n, superseded_only)
        for node in nodes:
            self._stash_state(node)
        return len(nodes)

    def _stash_state(self, node: TreeNode) -> None:
        """node's device snapshot leaves the device: backed up to the host first (write-back)
        unless a copy is there; dropped without host room."""
        if node.snapshot.host_slot is None:
            h = self._alloc_host_state()
            stats = self.tier.stats
            if h is None:
                stats.count("state_dropped")
            else:  # queued before the slot is freed: read before anything reuses it
                self.state_pool.queue_copy(node.snapshot.slot, self.state_pool.host_index(h))
                node.snapshot.host_slot = h
                self.tree.events.snapshot_stored(node, MEDIUM_CPU_STATE)
                stats.count("state_l1_to_l2")
                stats.count("bytes_l1_to_l2", self.state_pool.state_bytes)
        self._free_state(node)

    def _alloc_host_state(self) -> int | None:
        if not self.host_states.available():
            self.evict_host_states(1)
        return self.host_states.alloc()

    def evict_host_states(self, n: int) -> int:
        """Drop up to n host snapshots of evictable (snapshot_evictable), unpinned nodes, least
        recently used first."""
        heap = [
            x
            for x in self.tree.all_nodes()
            if x.snapshot.host_slot is not None and snapshot_evictable(x) and x.host.lock == 0
        ]
        nodes = heapq.nsmallest(n, heap, key=state_lru)
        for node in nodes:
            self._free_host_state(node)
            self.tier.stats.count("state_l2_evicted")
        return len(nodes)

    def _free_host_state(self, node: TreeNode) -> None:
        self.tree.events.snapshot_removed(node, MEDIUM_CPU_STATE)
        self.host_states.free(node.snapshot.host_slot)
        node.snapshot.host_slot = None

    # --- the tree's hooks --------------------------------------------------------------
    def leave_l1(self, node: TreeNode) -> None:
        """The snapshot goes down with the node when the node stays (its KV in L2)."""
        if node.snapshot.slot is not None:
            stays = node.host.value is not None or (
                self.tier.write_policy != "write_through_selective" and self.tier.backup(node)
            )
            if stays:
                self._stash_state(node)
            else:
                self._free_state(node)

    def leave_tree(self, node: TreeNode) -> None:
        if node.snapshot.host_slot is not None:
            self._free_host_state(node)

    def before_flush(self) -> None:
        """The queued copies run here (idle: no forward in flight), so the snapshots moved down
        by the flush are on the host when it returns."""
        self._settle()

    def after_flush(self) -> None:
        self._settle()
        self.state_pool.clear()

    def _settle(self) -> None:
        self.state_pool.apply_copies(self.state_pool.take_copies())

    def host_snapshot_count(self) -> int:
        return sum(1 for n in self.tree.all_nodes() if n.snapshot.host_slot is not None)

    def check(self) -> str | None:
        """Device snapshots only in L1, every host snapshot slot free, held back or on exactly one
        node (the tier's invariants are checked first)."""
        hs = self.host_states
        owners = [*hs.free_slots, *hs.deferred]
        for n in self.tree.all_nodes():
            if n.snapshot.slot is not None and n.value is None:
                return f"{n} keeps a device snapshot outside L1"
            if n.snapshot.host_slot is not None:
                owners.append(n.snapshot.host_slot)
        if sorted(owners) != list(range(hs.size)):
            return (
                f"host snapshot slots without exactly one owner ({len(owners)} owners of"
                f" {hs.size} slots)"
            )
        return None

    def info(self) -> dict:
        return {
            "l2_state_slots": self.host_states.size,
            "l2_state_slots_used": self.host_states.size - self.host_states.available(),
        }


def create_hi_mamba_radix_cache(
    config: HiCacheConfig, pool: TokenToKVPool, state_pool: MambaPool
) -> HiMambaRadixCache:
    """The tiered cache of a hybrid model. The host budget is split the way the device's is:
    --hicache-size's bytes in the device's proportion of state bytes to KV bytes, or
    --hicache-ratio x the device's snapshot slots beside --hicache-ratio x its KV tokens."""
    assert config.storage_backend is None, "refused for hybrids by prefix_cache_kind"
    dtype = host_dtype_for(pool.dtype, config.dtype)
    share = state_pool.total_bytes / (state_pool.total_bytes + pool.total_bytes)
    size, per_token = host_kv_size(config, pool, dtype, 1 - share)
    per_state = state_pool.state_bytes
    states = host_slots(config, per_state, state_pool.snapshots, share, "state snapshot")
    logger.info(
        "hierarchical cache: L2 %d tokens (%.1f MiB, %s) and %d state snapshots (%.1f MiB),"
        " write policy %s",
        size,
        size * per_token / 2**20,
        str(dtype).replace("torch.", ""),
        states,
        states * per_state / 2**20,
        config.write_policy,
    )
    return HiMambaRadixCache(
        pool,
        state_pool,
        HostKVPool(size, pool, dtype),
        HostStatePool(state_pool.layer_specs, states),
        config.write_policy,
        HiCacheStats(),
    )
