"""HiRadixCache: the radix tree over three tiers of KV (SGLang's HiCache, on a CPU engine).

    L1  the device pool the model reads (TokenToKVPool), node.value
    L2  a larger host pool, maybe more compact (HostKVPool), node.host_value
    L3  a storage backend (storage.py) of fixed-size chunks keyed by a hash chain from the model
        key; it outlives the process

A node is in L1, or only in L2 (value None, host_value set). L1 nodes form a prefix-closed
subtree: a node in L1 has its parent in L1, so a device match is a walk that stops at the first
node outside L1. Locks pin L1 nodes only.

Moves:
  down  evicting from L1 keeps a node in L2 (backed up at insert by write_through, when hot by
        write_through_selective, at eviction by write_back); evicting from L2 drops it (write_back
        stores its chunks in L3 first). Without room in L2 a node is dropped.
  up    admission matches L1, then loads the L2 nodes that continue the match into fresh L1 slots
        (match_and_load). A request's arrival looks for the chunks that continue its L1+L2 match
        in L3 and reads them on background threads into L2 (start_prefetch / poll_prefetches);
        the request waits for them (SGLang's wait_complete prefetch policy).
  L3    write_through / write_through_selective store the full chunks of a path when its nodes are
        backed up; write_back when they leave L2.

See docs/architecture.md, "Hierarchical cache".
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Optional

import torch

from radixlm.cache.hicache_io import HiCacheIO, HiCacheStats, Prefetch
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.kv_data import KVData
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.radix_cache import RadixCache, TreeNode, _clock, _key_match
from radixlm.cache.storage import HiCacheStorage, chunk_keys

logger = logging.getLogger(__name__)

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
STORAGE_BACKENDS = ("file",)
# write_through_selective backs a node up once it has been matched this often (SGLang's threshold).
SELECTIVE_HITS = 2


class HiRadixCache(RadixCache):
    def __init__(self, token_to_kv_pool: TokenToKVPool, host_pool: HostKVPool, write_policy: str = "write_through",
                 storage: Optional[HiCacheStorage] = None, model_key: str = "", chunk_size: int = 64,
                 stats: Optional[HiCacheStats] = None):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        self.host_pool = host_pool
        self.write_policy = write_policy
        self.stats = stats or HiCacheStats()  # shared with the storage backend's error counts
        self.storage = storage
        self.model_key = model_key
        self.chunk_size = chunk_size
        self.io = HiCacheIO(storage, self.stats) if storage is not None else None
        self.prefetches: list[Prefetch] = []
        super().__init__(token_to_kv_pool)

    def reset(self) -> None:
        super().reset()
        self.host_pool.clear()

    # --- admission: L1 match + L2 load-back --------------------------------------
    def match_and_load(self, key: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """The longest prefix in L1 or L2, all of it in L1 afterwards (loads L2 nodes back into fresh
        L1 slots); only the L1 part when L1 has no room for the rest."""
        indices, node = self.match_prefix(key)
        host_nodes = self._host_continuation(node, key[len(indices):])
        self._count_hits(node, host_nodes)
        need = sum(len(h.key) for h in host_nodes)
        if need == 0:
            return indices, node
        t0 = time.perf_counter()
        for h in host_nodes:
            h.host_lock += 1  # L1 eviction below may need L2 room: keep these
        self.inc_lock_ref(node)  # and keep the L1 prefix
        try:
            slots = self._alloc_l1(need)
        finally:
            self.dec_lock_ref(node)
            for h in host_nodes:
                h.host_lock -= 1
        if slots is None:
            return indices, node
        off = 0
        for h in host_nodes:
            n = len(h.key)
            h.value = slots[off : off + n]
            self.host_pool.load_into(self.token_to_kv_pool, h.host_value, h.value)
            self.evictable_size_ += n
            off += n
        self.stats.count("l2_hit_tokens", need)
        self.stats.count("l2_loads")
        self.stats.count("bytes_l2_to_l1", need * self.host_pool.bytes_per_token)
        self.stats.count("l2_load_seconds", time.perf_counter() - t0)
        return torch.cat([indices, slots]), host_nodes[-1]

    def _host_continuation(self, node: TreeNode, rest: list[int]) -> list[TreeNode]:
        """The L2-only nodes below `node` along `rest` (the last one split to end at the match)."""
        out, pos = [], 0
        while pos < len(rest):
            child = node.children.get(rest[pos])
            if child is None or child.value is not None:
                break
            m = _key_match(child.key, rest[pos:])
            if m < len(child.key):
                child = self._split_node(child, m)
            child.last_access_time = next(_clock)
            out.append(child)
            node, pos = child, pos + m
        return out

    def _count_hits(self, node: TreeNode, host_nodes: list[TreeNode]) -> None:
        if self.write_policy != "write_through_selective":
            return
        hot = None
        for n in host_nodes:
            n.hit_count += 1
        while node is not self.root_node:
            node.hit_count += 1
            if node.hit_count >= SELECTIVE_HITS and node.host_value is None:
                self._backup(node)
                hot = hot or node
            node = node.parent
        if hot is not None:
            self._store_path(hot)

    def match_len(self, key: list[int]) -> int:
        """Tokens of key's prefix held in L1 or L2 (a read-only walk)."""
        node, pos = self.root_node, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            m = _key_match(child.key, key[pos:])
            pos += m
            if m < len(child.key):
                break
            node = child
        return pos

    def _alloc_l1(self, need: int) -> Optional[torch.Tensor]:
        return _alloc(self.token_to_kv_pool, self.evict, need)

    # --- insert -----------------------------------------------------------------
    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """As RadixCache.insert; L2-only nodes on the path take the caller's slots (back in L1)."""
        assert len(key) == len(value), f"key/value length mismatch: {len(key)} vs {len(value)}"
        key, node, pos, shared, touched = list(key), self.root_node, 0, 0, []
        node.last_access_time = next(_clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                child = TreeNode()
                child.parent, child.key, child.value = node, key[pos:], value[pos:].clone()
                node.children[key[pos]] = child
                self.evictable_size_ += len(child.key)
                touched.append(child)
                node = child
                break
            child.last_access_time = next(_clock)
            m = _key_match(child.key, key[pos:])
            if m < len(child.key):
                child = self._split_node(child, m)
            if child.value is None:
                child.value = value[pos : pos + m].clone()
                self.evictable_size_ += m
                touched.append(child)
            else:
                assert not touched, "an L1 node below an L2-only node"
                shared += m
            node, pos = child, pos + m
        if self.write_policy == "write_through" and touched:
            for n in touched:
                self._backup(n)
            self._store_path(node)
        return shared

    def insert_host(self, token_ids: list[int], start: int, chunks: list[KVData]) -> int:
        """Hang KV read from L3 (consecutive chunks covering token_ids[start:]) below the tree's
        match of token_ids, in L2. Returns the tokens added (0 when the tree no longer reaches
        `start`)."""
        node, pos = self.root_node, 0
        while pos < len(token_ids):
            child = node.children.get(token_ids[pos])
            if child is None:
                break
            m = _key_match(child.key, token_ids[pos:])
            if m < len(child.key):
                child = self._split_node(child, m)
            node, pos = child, pos + m
        new = len(token_ids) - pos
        if pos < start or new <= 0:
            return 0
        node.host_lock += 1  # host eviction for room must not drop the node we hang below
        try:
            host = self._alloc_host(new)
        finally:
            node.host_lock -= 1
        if host is None:
            return 0
        at = start  # token position of the chunk's first token
        for data in chunks:  # chunk by chunk: concatenating them first costs a slow copy
            lo, hi = max(pos, at), at + data.num_tokens
            if lo < hi:
                part = KVData(*[t[:, lo - at :] if t is not None else None
                                for t in (data.k, data.v, data.k_scale, data.v_scale)])
                self.host_pool.set(host[lo - pos : hi - pos], part)
            at = hi
        leaf = TreeNode()
        leaf.parent, leaf.key, leaf.value, leaf.host_value = node, token_ids[pos:], None, host
        node.children[token_ids[pos]] = leaf
        return new

    # --- L1 eviction: down to L2 -------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        if num_tokens <= 0:
            return 0
        heap = [n for n in self.all_nodes() if self._l1_evictable(n)]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            node = heapq.heappop(heap)
            if not self._l1_evictable(node):  # changed since it was pushed
                continue
            n, parent = len(node.value), node.parent
            if node.host_value is None and self.write_policy != "write_through_selective":
                self._backup(node)
            self.token_to_kv_pool.free(node.value)
            self.evictable_size_ -= n
            node.value = None
            if node.host_value is not None:
                self.stats.count("l1_evicted_tokens", n)
            else:
                self._drop_subtree(node)
            evicted += n
            if parent is not self.root_node and self._l1_evictable(parent):
                heapq.heappush(heap, parent)
        return evicted

    @staticmethod
    def _l1_evictable(node: TreeNode) -> bool:
        return (node.value is not None and node.lock_ref == 0
                and all(c.value is None for c in node.children.values()))

    def _drop_subtree(self, node: TreeNode) -> None:
        """Remove an L1-evicted node without a backup and its L2-only subtree from the tree."""
        del node.parent.children[node.key[0]]
        stack = [node]
        while stack:
            n = stack.pop()
            assert n.value is None and n.host_lock == 0, n
            if n.host_value is not None:
                self.host_pool.free(n.host_value)
                n.host_value = None
            self.stats.count("dropped_tokens", len(n.key))
            stack.extend(n.children.values())
            n.parent = None

    # --- L2 -------------------------------------------------------------------------
    def _backup(self, node: TreeNode) -> bool:
        """Copy an L1 node's KV to L2 (if not there yet). False: no room in L2."""
        if node.host_value is not None:
            return True
        node.host_lock += 1
        try:
            host = self._alloc_host(len(node.value))
        finally:
            node.host_lock -= 1
        if host is None:
            return False
        self.host_pool.backup_from(self.token_to_kv_pool, node.value, host)
        node.host_value = host
        self.stats.count("bytes_l1_to_l2", len(host) * self.host_pool.bytes_per_token)
        return True

    def _alloc_host(self, need: int) -> Optional[torch.Tensor]:
        return _alloc(self.host_pool, self.evict_host, need)

    def evict_host(self, num_tokens: int) -> int:
        """Free L2 slots, least recently used first: L2-only leaves (gone from the tree; stored in
        L3 first under write_back) and backups of L1 nodes (the node stays, in L1 only)."""
        def candidate(n: TreeNode) -> bool:
            if n.host_value is None or n.host_lock > 0:
                return False
            return n.value is not None or not n.children

        heap = [n for n in self.all_nodes() if candidate(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)
            if not candidate(node) or node.parent is None:
                continue
            n = len(node.host_value)
            if node.value is None and self.write_policy == "write_back":
                self._store_path(node)
            self.host_pool.free(node.host_value)
            node.host_value = None
            freed += n
            self.stats.count("l2_evicted_tokens", n)
            if node.value is None:  # L2-only leaf: it leaves the tree
                parent = node.parent
                del parent.children[node.key[0]]
                node.parent = None
                self.stats.count("dropped_tokens", n)
                if parent is not self.root_node and candidate(parent):
                    heapq.heappush(heap, parent)
        return freed

    # --- L3 ---------------------------------------------------------------------
    def _path(self, node: TreeNode) -> list[TreeNode]:
        out = []
        while node is not self.root_node:
            out.append(node)
            node = node.parent
        return out[::-1]

    def _store_path(self, node: TreeNode) -> None:
        """Queue the full chunks of the path to `node` that L3 lacks (read from L1 or L2 now)."""
        if self.io is None:
            return
        path = self._path(node)
        ids = [t for n in path for t in n.key]
        n_chunks = len(ids) // self.chunk_size
        if n_chunks == 0:
            return
        keys = chunk_keys(self.model_key, ids, self.chunk_size, n_chunks)
        for i, key in enumerate(keys):
            if self.io.is_pending(key) or self.storage.exists(key):
                continue
            lo, hi = i * self.chunk_size, (i + 1) * self.chunk_size
            self.io.write(key, ids[lo:hi], self._gather(path, lo, hi))

    def _gather(self, path: list[TreeNode], lo: int, hi: int) -> KVData:
        """KV of tokens [lo, hi) of a path, from whichever tier holds each node, as L2's type."""
        parts, pos = [], 0
        for n in path:
            a, b = max(lo, pos), min(hi, pos + len(n.key))
            if a < b:
                if n.value is not None:
                    parts.append(HostKVPool.read_device(self.token_to_kv_pool, n.value[a - pos : b - pos],
                                                        self.host_pool.dtype))
                else:
                    parts.append(self.host_pool.get(n.host_value[a - pos : b - pos]))
            pos += len(n.key)
            if pos >= hi:
                break
        return KVData.cat(parts)

    def start_prefetch(self, token_ids: list[int]) -> Optional[Prefetch]:
        """Start reading the L3 chunks that continue token_ids' L1+L2 match; None if there are none."""
        if self.io is None:
            return None
        c = self.chunk_size
        total = len(token_ids) // c
        first = self.match_len(token_ids) // c
        if first >= total:
            return None
        keys = chunk_keys(self.model_key, token_ids, c, total)[first:]
        futures = []
        for i, key in enumerate(keys):
            if key not in self.io.inflight and not self.storage.exists(key):
                break
            lo = (first + i) * c
            futures.append(self.io.read(key, token_ids[lo : lo + c]))
        if not futures:
            return None
        p = Prefetch(token_ids[: (first + len(futures)) * c], first * c, futures, keys[: len(futures)])
        self.prefetches.append(p)
        return p

    def poll_prefetches(self) -> None:
        """Hang the chunks read so far into L2, in order, while later ones are still being read
        (the copy overlaps the reads); a prefetch is done when every read has ended."""
        c = self.chunk_size
        for p in list(self.prefetches):
            ready = []
            while not p.failed and p.taken + len(ready) < len(p.futures) and p.futures[p.taken + len(ready)].done():
                f = p.futures[p.taken + len(ready)]
                data = None if f.cancelled() or f.exception() is not None else f.result()
                if data is None:
                    p.failed = True
                else:
                    ready.append(data)
            if ready:
                lo, p.taken = p.start + p.taken * c, p.taken + len(ready)
                added = self.insert_host(p.token_ids[: p.start + p.taken * c], lo, ready)
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

    # --- flush, introspection ----------------------------------------------------
    def flush(self, level: str = "l1") -> None:
        """Empty L1 (nodes move down as eviction moves them); level "l2" empties L2 too, "l3" also
        the storage. Only while no request holds KV."""
        assert self.protected_size_ == 0, "flush with requests holding KV"
        if level == "l1":
            self.evict(self.evictable_size_)
            return
        self.reset()
        if level == "l3" and self.storage is not None:
            self.io.wait_writes()
            self.storage.clear()

    def host_size(self) -> int:
        return self.host_pool.size - self.host_pool.available_size()

    def check_tiers(self) -> Optional[str]:
        """The tier invariants (what is wrong, or None): L1 prefix-closed, L2-only nodes unlocked and
        backed, every L2 slot owned exactly once."""
        parts = [self.host_pool.free_slots]
        for n in self.all_nodes():
            if n.value is not None and n.parent is not self.root_node and n.parent.value is None:
                return f"{n} is in L1 below an L2-only node"
            if n.value is None and (n.host_value is None or n.lock_ref):
                return f"{n} is in no tier or locked outside L1"
            if n.host_lock:
                return f"{n} pinned in L2 outside a load"
            if n.host_value is not None:
                if len(n.host_value) != len(n.key):
                    return f"{n}: {len(n.host_value)} L2 slots for {len(n.key)} tokens"
                parts.append(n.host_value)
        counts = torch.bincount(torch.cat(parts), minlength=self.host_pool.size + 1)
        if counts[0] != 0 or counts.numel() != self.host_pool.size + 1 or bool((counts[1:] != 1).any()):
            return "an L2 slot without exactly one owner"
        return None

    def info(self) -> dict:
        out = {**self.stats.as_dict(), "l2_size_tokens": self.host_pool.size, "l2_used_tokens": self.host_size(),
               "write_policy": self.write_policy}
        if self.storage is not None:
            out["l3_bytes"] = getattr(self.storage, "bytes", None)
        return out

    def close(self) -> None:
        if self.io is not None:
            self.io.close()



def _alloc(pool, evict, need: int) -> Optional[torch.Tensor]:
    """`need` slots of a tier's pool, evicting from that tier first when it is short."""
    short = need - pool.available_size()
    if short > 0:
        evict(short)
    return pool.alloc(need)


def create_hiradix_cache(server_args, runner, load_tokenizer) -> HiRadixCache:
    """The tiered cache of --enable-hierarchical-cache for a ModelRunner's pool."""
    from radixlm.cache.host_pool import host_dtype_for
    from radixlm.cache.storage import create_storage, model_key, tokenizer_fingerprint

    pool = runner.token_to_kv_pool
    dtype = host_dtype_for(pool.dtype, server_args.hicache_dtype)
    per_token = TokenToKVPool.bytes_per_token(pool.num_layers, pool.num_kv_heads, pool.head_dim, dtype)
    if server_args.hicache_size > 0:
        size = int(server_args.hicache_size * 2**30) // per_token
    else:
        size = int(server_args.hicache_ratio * runner.max_total_num_tokens)
    if size < 1:
        raise ValueError("the L2 pool would hold no token (raise --hicache-size or --hicache-ratio)")
    storage, key, stats = None, "", HiCacheStats()
    if server_args.hicache_storage_backend is not None:
        key = model_key(runner, tokenizer_fingerprint(load_tokenizer()), dtype)
        storage = create_storage(server_args.hicache_storage_backend, server_args.hicache_storage_path, key,
                                 int(server_args.hicache_storage_size_gb * 2**30), stats)
    logger.info("hierarchical cache: L2 %d tokens (%.1f MiB, %s), write policy %s%s", size,
                size * per_token / 2**20, str(dtype).replace("torch.", ""), server_args.hicache_write_policy,
                f", L3 {server_args.hicache_storage_backend} in {server_args.hicache_storage_path}" if storage else "")
    return HiRadixCache(pool, HostKVPool(size, pool, dtype), server_args.hicache_write_policy, storage, key,
                        server_args.hicache_storage_chunk_size, stats)
