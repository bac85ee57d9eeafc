"""CacheManager: the only code that moves KV between a request and the radix tree.

Ownership. Every KV slot of TokenToKVPool (1..size; slot 0 is a dummy) has exactly one owner:

    the free list   token_to_kv_pool.free_slots
    the tree        the values of RadixCache nodes; a node is protected (not evictable) while
                    some request's `last_node` is the node or below it
    one request     req_to_token[req_pool_idx, cache_protected_len:kv_allocated_len]

and every request slot (a row of ReqToTokenPool) is free or held by exactly one request.

Moves (all on the scheduler thread):

    assign        admission: the matched prefix's slots become the request's protected range
                  (its node locked), a row is taken from the free rows
    alloc_kv      free list -> a step's new slots (after evicting unlocked LRU leaves); ScheduleBatch
                  writes them into the requests' rows, extending their own range
    cache_req(finished=False)
                  the request's committed KV -> the tree; own slots that duplicate what the tree
                  already holds are freed, the row is repointed at the tree's slots, the lock moves
                  down to the new node: its protected range grows to kv_committed_len
    cache_req(finished=True), release
                  as above (a hybrid's tracker may first commit the token a step in flight ran
                  on: StateTracker.takes_in_flight_token), then the uncommitted tail (a step that
                  ran for nothing) -> free list,
                  the lock is dropped, the row is freed; the request holds nothing afterwards
    free_tail     the request's own slots past a length -> free list (jump-forward re-tokenizes)
    free_uncommitted
                  the request's allocated but uncommitted slots -> free list (rejected drafts)

With the radix cache disabled (NoPrefixCache) nothing moves to a tree: NoCacheManager keeps a
request's whole range its own until it leaves. Beside the slots move a hybrid model's recurrent
states (`states`: state_tracker.py) and a sliding-window model's windowed-layer slots (`windows`:
window_tracker.py), each told of every move above by its no-op or real tracker.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import torch

from radixlm.cache.base_prefix_cache import BasePrefixCache, MatchResult
from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.cache.tree_node import TreeNode
from radixlm.scheduler.kv.state_tracker import BaseStateTracker, NoStateTracker
from radixlm.scheduler.kv.window_tracker import (
    BaseWindowTracker,
    NoWindowTracker,
    create_window_tracker,
)
from radixlm.scheduler.req import Req


class CacheManager:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: TokenToKVPool,
        tree_cache: BasePrefixCache,
        states: BaseStateTracker | None = None,
        windows: BaseWindowTracker | None = None,
    ):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.tree_cache = tree_cache
        # A hybrid model's recurrent states, moved along (state_tracker.py); the no-op otherwise.
        self.states = states or NoStateTracker()
        # The windowed layers' KV of a sliding-window model (window_tracker.py); the no-op
        # otherwise.
        self.windows = windows or NoWindowTracker()

    @staticmethod
    def create(
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: TokenToKVPool,
        tree_cache: BasePrefixCache,
        states: BaseStateTracker | None = None,
        windows: BaseWindowTracker | None = None,
    ) -> CacheManager:
        """The manager for this cache: one that hands KV to the tree, or keeps it with the
        request."""
        cls = CacheManager if tree_cache.capabilities().shares_prefixes else NoCacheManager
        # The windowed layers' tracker the pool needs (no-op unless it has their own slots).
        windows = windows or create_window_tracker(token_to_kv_pool, req_to_token_pool, tree_cache)
        return cls(req_to_token_pool, token_to_kv_pool, tree_cache, states, windows)

    # --- budget -----------------------------------------------------------------
    def kv_room(self) -> int:
        """KV slots an allocation can get: free ones plus evictable radix-tree leaves (and no more
        than the windowed layers' slot space can get)."""
        room = self.token_to_kv_pool.available_size() + self.tree_cache.evictable_size()
        swa = self.windows.room()
        return room if swa is None else min(room, swa)

    # --- admission --------------------------------------------------------------
    def match(self, req: Req) -> MatchResult:
        """Admission's match of the cached prefix req may reuse (see Req.max_prefix_len); a
        hierarchical tree also loads the part held in L2 back into L1."""
        return self.tree_cache.match_prefix(req.prefix_key(req.max_prefix_len()))

    def peek(self, req: Req) -> MatchResult:
        """The same lookup for ordering only: the tree is left as it is."""
        return self.tree_cache.peek_prefix(req.prefix_key(req.max_prefix_len()))

    def lock(self, node: TreeNode) -> int:
        """Pin node's path; returns the change in evictable tokens (<= 0)."""
        return self.tree_cache.inc_lock_ref(node)

    def unlock(self, node: TreeNode) -> int:
        return self.tree_cache.dec_lock_ref(node)

    def assign(self, req: Req, prefix_indices: torch.Tensor, node: TreeNode) -> None:
        """Give a waiting request a row starting with its matched prefix; `node` (where the match
        ends) must already be locked for it."""
        assert not req.holds_kv() and req.last_node is None, f"{req.rid} already holds KV"
        idx = self.req_to_token_pool.alloc()
        assert idx is not None, "admission must check request slots"
        n = len(prefix_indices)
        self.req_to_token_pool.req_to_token[idx, :n] = prefix_indices
        req.req_pool_idx, req.last_node = idx, node
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = n
        self.states.on_assign(req, node)
        self.windows.on_assign(req)

    def alloc_kv(self, need: int) -> torch.Tensor | None:
        """`need` free KV slots, evicting unlocked radix-tree leaves if the pool is short."""
        short = need - self.token_to_kv_pool.available_size()
        if short > 0:
            self.tree_cache.evict(short)
        self.windows.make_room(need)
        return self.token_to_kv_pool.alloc(need)

    # --- request <-> tree -------------------------------------------------------
    def cache_req(self, req: Req, finished: bool) -> None:
        """Hand req's committed KV to the tree (module docstring). finished=True also frees the
        uncommitted tail, the lock and the row."""
        tree, pool = self.tree_cache, self.token_to_kv_pool
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        if finished and self.states.takes_in_flight_token(req):
            req.kv_committed_len = req.kv_allocated_len
        protected, committed, allocated = (
            req.cache_protected_len,
            req.kv_committed_len,
            req.kv_allocated_len,
        )
        assert 0 <= protected <= committed <= allocated, (req.rid, protected, committed, allocated)
        if committed > protected:
            key = req.prefix_key(committed)
            shared = tree.insert(key, row[:committed].clone())
            # [0, shared) was in the tree already: [0, protected) is ours through the lock, and
            # [protected, shared) another request inserted meanwhile, so our copies are duplicates.
            assert shared >= protected, (req.rid, shared, protected)
            if shared > protected:
                self.windows.adopt_duplicates(req, key, protected, shared)
            pool.free(row[protected:shared].clone())
            if not finished:
                # No eviction runs between the insert and this lookup, so it is a full match; the
                # insert made a node end exactly at `committed`.
                indices, node = tree.kv_match(key)
                assert len(indices) == committed
                row[protected:committed] = indices[protected:]
                # Lock the new node before unlocking its ancestor: the shared path never looks
                # evictable.
                tree.inc_lock_ref(node)
                tree.dec_lock_ref(req.last_node)
                req.last_node, req.cache_protected_len = node, committed
                protected = committed
                self.windows.on_cached(req, committed)
            self.states.on_cached(req, committed)
        if finished:
            self.states.on_release(req)
            self._leave(req, own_from=committed)

    def _leave(self, req: Req, own_from: int) -> None:
        """req gives up its row: its own slots from own_from on go to the free list, the lock
        goes."""
        self.windows.on_release(req)
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.token_to_kv_pool.free(row[own_from : req.kv_allocated_len].clone())
        self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node = None, None
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = 0

    def release(self, req: Req) -> None:
        """req leaves (finished, aborted, retracted): its KV goes to the tree or the free list."""
        if req.holds_kv():
            self.cache_req(req, finished=True)

    def free_tail(self, req: Req, keep: int) -> None:
        """Free req's own slots from position `keep` on (tokens it will recompute)."""
        assert req.cache_protected_len <= keep <= req.kv_committed_len == req.kv_allocated_len, (
            req.rid,
            keep,
            req.cache_protected_len,
            req.kv_committed_len,
            req.kv_allocated_len,
        )
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.token_to_kv_pool.free(row[keep : req.kv_allocated_len].clone())
        req.kv_committed_len = req.kv_allocated_len = keep

    def release_from(self, req: Req, keep: int) -> None:
        """Free req's KV from position `keep` on. Past the tree's share (cache_protected_len) its
        own slots go; within it req must leave (it holds a path, not a prefix of one) and comes
        back through the tree later; the tree's nodes stay."""
        if keep >= req.cache_protected_len:
            self.free_tail(req, keep)
        else:
            self._leave(req, own_from=req.cache_protected_len)

    def reorder_own(self, req: Req, start: int, order: list[int]) -> None:
        """Reorder req's own uncommitted slots from column `start`: column start + j takes the slot
        now at start + order[j] (a draft tree's accepted path moves up to follow the root; the
        rest, now past it, is freed as uncommitted). The slots stay req's."""
        assert req.kv_committed_len <= start and start + len(order) <= req.kv_allocated_len, (
            req.rid,
            start,
            len(order),
            req.kv_committed_len,
            req.kv_allocated_len,
        )
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        cols = torch.tensor(order, dtype=torch.int64, device=row.device) + start
        row[start : start + len(order)] = row[cols]

    def free_uncommitted(self, req: Req) -> None:
        """Free req's own slots past kv_committed_len: the KV of draft tokens a verify step
        rejected."""
        assert req.cache_protected_len <= req.kv_committed_len <= req.kv_allocated_len, (
            req.rid,
            req.cache_protected_len,
            req.kv_committed_len,
            req.kv_allocated_len,
        )
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.token_to_kv_pool.free(row[req.kv_committed_len : req.kv_allocated_len].clone())
        req.kv_allocated_len = req.kv_committed_len

    def flush(self, level: str = "l1") -> None:
        """Idle only. A hierarchical tree keeps what it moved down to L2/L3 unless level says
        more."""
        self.tree_cache.flush(level)
        self.token_to_kv_pool.clear()
        self.req_to_token_pool.clear()
        self.states.flush()


class NoCacheManager(CacheManager):
    """Without a prefix cache: a request's KV is its own from admission to the end, then freed."""

    def cache_req(self, req: Req, finished: bool) -> None:
        assert req.cache_protected_len == 0, req.rid
        if finished:
            self.states.on_release(req)
            self._leave(req, own_from=0)
