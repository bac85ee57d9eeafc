"""The scheduler's invariants, checked after every step with --enable-invariant-checks (always
on in tests). A broken invariant is the one error that stops the scheduler: serving on would
hand out wrong KV."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable

import torch

from radixlm.cache.tree_node import TreeNode
from radixlm.errors import InvariantError
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req import Req
from radixlm.scheduler.req_queues import ReqQueues

__all__ = [
    "BaseInvariantChecks",
    "InvariantChecker",
    "InvariantError",
    "NoInvariantChecks",
    "check_invariants",
]


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def check_invariants(
    cm: CacheManager, holders: Iterable[Req], idle: Iterable[Req], pins: Iterable[TreeNode] = ()
) -> None:
    """holders: every request that holds KV (running, the chunked request, releases deferred
    behind the step in flight); idle: requests that must hold nothing (waiting, compiling);
    pins: nodes locked by open sessions (session_pins.py), one lock each, still in the tree.

    - every KV slot has exactly one owner: the free list, the tree, or one request's own range
      (cache_manager.py); slot 0 has none
    - a request's protected range is exactly the tree path to its last_node (ids and slots)
    - every node's lock count equals the number of requests whose last_node is at or below it;
      the evictable / protected counters agree with the locks
    - every request slot is free or held by one request
    - a hybrid model's snapshot slots: each free, in one tree node or in one holder's tracks
    """
    holders = list(holders)
    tree, pool, rows = cm.tree_cache, cm.token_to_kv_pool, cm.req_to_token_pool
    nodes = tree.all_nodes()
    # A hierarchical tree's nodes outside L1 (value None) own no KV slot; the tree's own check
    # covers them.
    parts = [pool.free_slots] + [n.value for n in nodes if n.value is not None]
    locks: Counter = Counter()
    owner_of_row: dict[int, str] = {}
    for r in holders:
        if r.req_pool_idx is None or r.last_node is None:
            _fail(f"request {r.rid} is scheduled but holds no row or lock")
        if not 0 <= r.cache_protected_len <= r.kv_committed_len <= r.kv_allocated_len:
            _fail(
                f"request {r.rid}: bad lengths protected {r.cache_protected_len} committed "
                f"{r.kv_committed_len} allocated {r.kv_allocated_len}"
            )
        if r.req_pool_idx in owner_of_row:
            _fail(
                f"request slot {r.req_pool_idx} held by {owner_of_row[r.req_pool_idx]} and {r.rid}"
            )
        owner_of_row[r.req_pool_idx] = r.rid
        row = rows.req_to_token[r.req_pool_idx]
        parts.append(row[r.cache_protected_len : r.kv_allocated_len])
        ids, slots = tree.path_to(r.last_node)
        if len(ids) != r.cache_protected_len or not torch.equal(
            slots.to(row.device), row[: len(ids)]
        ):
            _fail(
                f"request {r.rid}: protected range ({r.cache_protected_len}) is not its node's path"
                f" ({len(ids)})"
            )
        if ids != r.all_ids()[: len(ids)]:
            _fail(f"request {r.rid}: its node's path holds other tokens")
        if ids and r.last_node.namespace != r.cache_namespace:
            _fail(
                f"request {r.rid} (namespace {r.cache_namespace!r}) holds KV of namespace"
                f" {r.last_node.namespace!r}"
            )
        node = r.last_node
        while node is not tree.root_node:
            locks[node.id] += 1
            node = node.parent
    for node in pins:
        while node is not tree.root_node:
            if node.parent is None or node.parent.children.get(node.lookup_key()) is not node:
                _fail(f"a session pins {node}, which is no longer in the tree")
            locks[node.id] += 1
            node = node.parent
    for r in idle:
        if r.holds_kv() or r.last_node is not None or r.kv_allocated_len or r.cache_protected_len:
            _fail(f"waiting request {r.rid} holds KV")

    counts = torch.bincount(torch.cat(parts), minlength=pool.size + 1)
    if counts.numel() > pool.size + 1:
        _fail(
            "slot ids beyond the pool:"
            f" {(counts[pool.size + 1 :] > 0).nonzero().flatten()[:8].tolist()}"
        )
    if counts[0] != 0:
        _fail("the dummy slot 0 is owned")
    bad = (counts[1:] != 1).nonzero().flatten()
    if bad.numel():
        s = int(bad[0]) + 1
        _fail(
            f"{bad.numel()} KV slot(s) without exactly one owner, e.g. slot {s} with"
            f" {int(counts[s])} (free {pool.available_size()}, tree {tree.total_size()}, holders"
            f" {len(owner_of_row)})"
        )

    protected = total = 0
    for n in nodes:  # len(key) == len(value): the tree asserts it on insert
        if n.lock_ref != locks[n.id]:
            _fail(f"{n} has lock_ref {n.lock_ref} but {locks[n.id]} request(s) hold it")
        if n.value is not None:
            total += len(n.key)
            protected += len(n.key) if n.lock_ref > 0 else 0
    if tree.root_node.lock_ref != 1:
        _fail(f"root lock_ref {tree.root_node.lock_ref}")
    if protected != tree.protected_size() or total - protected != tree.evictable_size():
        _fail(
            f"tree counters drifted: protected {tree.protected_size()} (walk {protected}), "
            f"evictable {tree.evictable_size()} (walk {total - protected})"
        )

    tier_error = tree.check()
    if tier_error:
        _fail(f"hierarchical cache: {tier_error}")
    pool_error = pool.check() or cm.windows.check(holders)
    if pool_error:
        _fail(pool_error)

    _check_state_slots(cm, holders)
    free_rows = rows.free_slots
    if len(set(free_rows)) != len(free_rows) or set(free_rows) & set(owner_of_row):
        _fail("a request slot is free twice, or free and held")
    if len(free_rows) + len(owner_of_row) != rows.size:
        _fail(f"request slot leak: {len(free_rows)} free + {len(owner_of_row)} held != {rows.size}")


def _check_state_slots(cm: CacheManager, holders: list[Req]) -> None:
    owned = cm.states.owned_slots(holders)
    if owned is None:
        return
    pool = cm.states.pool
    counts = Counter(owned)
    # snapshot slots, then draft slots (speculative decoding)
    wrong = [s for s in range(pool.rows, pool.num_slots) if counts.pop(s, 0) != 1]
    if wrong or counts:
        _fail(
            f"state snapshot slots without exactly one owner: {wrong[:8]}"
            f" (unknown slots {list(counts)[:8]}; free {pool.available_snapshots()})"
        )


class BaseInvariantChecks(ABC):
    """What the loop runs after every step: InvariantChecker, or NoInvariantChecks."""

    @abstractmethod
    def after_step(self) -> None:
        """Check the state the step left (InvariantError on a broken invariant)."""


class InvariantChecker(BaseInvariantChecks):
    """--enable-invariant-checks: after every step, each request's status names the container that
    holds it (ReqQueues.check), and check_invariants on the KV."""

    def __init__(
        self,
        cache_manager: CacheManager,
        queues: ReqQueues,
        pins: Callable[[], Iterable[TreeNode]] = lambda: (),
    ):
        self.cache_manager = cache_manager
        self.queues = queues
        self.pins = pins  # the sessions' locked nodes (session_pins.py)

    def after_step(self) -> None:
        error = self.queues.check()
        if error:
            _fail(f"request lifecycle: {error}")
        check_invariants(
            self.cache_manager, self.queues.holders(), self.queues.idle_reqs(), self.pins()
        )


class NoInvariantChecks(BaseInvariantChecks):
    def after_step(self) -> None:
        pass
