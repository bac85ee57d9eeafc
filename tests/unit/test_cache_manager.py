"""CacheManager (the only code that moves KV between a request and the tree) and the scheduler's
invariant check: unit tests, a stateful property test against a naive model of the tree, and
the check catching each kind of corruption."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.cache.no_prefix_cache import NoPrefixCache
from radixlm.cache.radix_cache import RadixCache
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.invariants import InvariantError, check_invariants
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req import Req
from tests.unit.test_radix_cache import cached_prefixes, path_key

KV_SIZE = 64


def make_manager(
    kv_size: int = KV_SIZE, disable: bool = False, num_reqs: int = 4, max_len: int = 32
) -> CacheManager:
    kv_pool = TokenToKVPool(kv_size, num_layers=1, num_kv_heads=1, head_dim=1)
    tree = NoPrefixCache() if disable else RadixCache(kv_pool)
    return CacheManager.create(ReqToTokenPool(num_reqs, max_len), kv_pool, tree)


def new_req(ids: list[int], rid: str = "r") -> Req:
    return Req(
        rid=rid, origin_input_ids=list(ids), sampling_params=SamplingParams(max_new_tokens=8)
    )


def admit(cm: CacheManager, ids: list[int], rid: str = "r") -> Req:
    """What admission + an extend step do: match and lock the prefix, take a row, allocate and
    compute the rest."""
    req = new_req(ids, rid)
    prefix, node = cm.match(req)
    cm.lock(node)
    cm.assign(req, prefix, node)
    grow(cm, req, req.seqlen - req.kv_allocated_len)
    return req


def grow(cm: CacheManager, req: Req, n: int, commit: bool = True) -> None:
    """Allocate n slots after the request's own range (a step); commit: the step has run."""
    slots = cm.alloc_kv(n)
    assert slots is not None
    a = req.kv_allocated_len
    cm.req_to_token_pool.req_to_token[req.req_pool_idx, a : a + n] = slots
    req.kv_allocated_len += n
    if commit:
        req.kv_committed_len = req.kv_allocated_len


def row(cm: CacheManager, req: Req, n: int) -> list[int]:
    return cm.req_to_token_pool.req_to_token[req.req_pool_idx, :n].tolist()


def check(cm: CacheManager, *holders: Req) -> None:
    check_invariants(cm, list(holders), [])


def test_finished_request_shares_and_frees_duplicates():
    cm = make_manager()
    pool, tree = cm.token_to_kv_pool, cm.tree_cache
    a = admit(cm, [1, 2, 3, 4], "a")
    b = admit(cm, [1, 2, 3, 5], "b")  # nothing cached yet: no sharing
    assert b.cache_protected_len == 0
    check(cm, a, b)

    a_slots = row(cm, a, 4)
    cm.release(a)
    check(cm, b)
    assert tree.match_prefix(PrefixKey([1, 2, 3, 4]))[0].tolist() == a_slots

    b_slots = row(cm, b, 4)
    free_before = pool.available_size()
    cm.release(b)
    # b's [1,2,3] duplicated a's: those 3 slots are freed, its last one joins the tree.
    assert pool.available_size() == free_before + 3
    assert set(b_slots[:3]) <= set(pool.free_slots.tolist())
    assert tree.match_prefix(PrefixKey([1, 2, 3, 5]))[0].tolist() == a_slots[:3] + b_slots[3:]
    check(cm)
    assert cm.req_to_token_pool.available_size() == cm.req_to_token_pool.size

    c = admit(cm, [1, 2, 3, 4, 6], "c")
    assert row(cm, c, 4) == a_slots and c.cache_protected_len == 4 and c.last_node.lock_ref == 1
    assert tree.protected_size() == 4
    check(cm, c)
    cm.release(c)
    assert tree.protected_size() == 0 and tree.total_size() == 6
    assert tree.evict(100) == 6 and pool.available_size() == KV_SIZE


def test_unfinished_request_is_repointed_at_the_tree():
    cm = make_manager()
    tree = cm.tree_cache
    a = admit(cm, [1, 2, 3], "a")
    b = admit(cm, [1, 2, 3, 4, 5], "b")  # computes [1,2,3] again
    cm.cache_req(a, finished=False)
    a_slots = row(cm, a, 3)
    assert a.cache_protected_len == 3 and path_key(a.last_node) == [1, 2, 3]
    assert tree.protected_size() == 3 and tree.evictable_size() == 0
    check(cm, a, b)

    b_old = row(cm, b, 5)
    cm.cache_req(b, finished=False)
    # b's duplicate slots for [1,2,3] were freed and its row now points at the tree's.
    assert row(cm, b, 5) == a_slots + b_old[3:] and b.cache_protected_len == 5
    assert set(b_old[:3]) <= set(cm.token_to_kv_pool.free_slots.tolist())
    assert path_key(b.last_node) == [1, 2, 3, 4, 5]
    assert a.last_node.lock_ref == 2 and b.last_node.lock_ref == 1
    check(cm, a, b)

    # A next chunk: b grows, gets fresh slots for the new tokens, caches again.
    b.origin_input_ids += [6, 7]
    grow(cm, b, 2)
    check(cm, a, b)
    old_last = b.last_node
    cm.cache_req(b, finished=False)
    # The lock moved down to [6,7]; old_last is now its (still locked) parent.
    assert b.last_node.parent is old_last and b.last_node.lock_ref == old_last.lock_ref == 1
    assert b.cache_protected_len == 7 and tree.evictable_size() == 0
    check(cm, a, b)

    assert tree.evict(100) == 0  # everything is locked by a or b
    cm.release(a)
    cm.release(b)  # b's whole row is in the tree: nothing to free
    check(cm)
    assert tree.protected_size() == 0 and tree.total_size() == 7
    tree.evict(100)
    assert cm.token_to_kv_pool.available_size() == KV_SIZE


def test_release_inserts_only_committed_kv_and_frees_the_uncommitted_tail():
    """A step in flight allocated a slot whose K/V is not computed yet (overlap), or a chunk's slots
    were allocated by a step that failed: those never reach the tree."""
    cm = make_manager()
    a = admit(cm, [1, 2, 3, 4], "a")
    a.output_ids = [9]
    grow(cm, a, 1, commit=False)  # the decode step of token 9 is in flight
    tail = row(cm, a, 5)[4]
    check(cm, a)
    cm.release(a)
    assert cm.tree_cache.total_size() == 4 and cached_prefixes(cm.tree_cache).keys() == {
        (None, 1),
        (None, 1, 2),
        (None, 1, 2, 3),
        (None, 1, 2, 3, 4),
    }
    assert tail in cm.token_to_kv_pool.free_slots.tolist()
    check(cm)


def test_free_tail_frees_own_slots_only():
    cm = make_manager()
    a = admit(cm, [1, 2, 3], "a")
    cm.cache_req(a, finished=False)
    a.output_ids = [4, 5, 6]
    grow(cm, a, 2)  # KV of 4 and 5
    own = row(cm, a, 5)[3:]
    cm.free_tail(a, 3)
    assert (a.kv_committed_len, a.kv_allocated_len) == (3, 3)
    assert set(own) <= set(cm.token_to_kv_pool.free_slots.tolist())
    check(cm, a)
    with pytest.raises(AssertionError):
        cm.free_tail(a, 2)  # below the protected range: the tree's slots
    cm.release(a)
    check(cm)


def test_release_from_within_the_trees_share_leaves_the_row_and_keeps_the_nodes():
    """Jump-forward re-tokenizes tokens whatever the tree holds: below the protected range the
    request leaves (own slots freed, lock dropped) and the tree keeps the old path."""
    cm = make_manager()
    a = admit(cm, [1, 2, 3], "a")
    a.output_ids = [4, 5]
    grow(cm, a, 2)  # KV of 4 and 5
    cm.cache_req(a, finished=False)  # [1..5] in the tree, all protected
    a.output_ids = [4, 5, 6]
    grow(cm, a, 1)  # KV of 6: a's own
    own = row(cm, a, 6)[5:]
    cm.release_from(a, 4)  # re-tokenize 5 and 6
    assert not a.holds_kv() and a.cache_protected_len == 0
    assert set(own) <= set(cm.token_to_kv_pool.free_slots.tolist())
    assert (None, 1, 2, 3, 4, 5) in cached_prefixes(cm.tree_cache)
    check(cm)
    b = admit(cm, [1, 2, 3], "b")
    b.output_ids = [4, 5]
    grow(cm, b, 2)
    cm.release_from(b, 4)  # at or past the protected range: free_tail, the row stays
    assert b.holds_kv() and b.kv_committed_len == 4
    check(cm, b)
    cm.release(b)
    check(cm)


def test_disabled_cache_no_sharing_frees_everything():
    cm = make_manager(disable=True)
    a = admit(cm, [1, 2, 3], "a")
    own = row(cm, a, 3)
    cm.cache_req(
        a, finished=False
    )  # no sharing: a keeps its own slots, and its next chunk builds on them
    assert (
        row(cm, a, 3) == own
        and a.cache_protected_len == 0
        and a.last_node is cm.tree_cache.root_node
    )
    b = admit(cm, [1, 2, 3, 4], "b")
    assert b.cache_protected_len == 0
    assert cm.token_to_kv_pool.available_size() == KV_SIZE - 7
    check(cm, a, b)
    cm.release(a)
    cm.release(b)
    assert cm.token_to_kv_pool.available_size() == KV_SIZE and cm.tree_cache.total_size() == 0
    check(cm)


# --- the invariant check catches each kind of corruption ------------------------------


def _two_requests():
    cm = make_manager()
    a = admit(cm, [1, 2, 3, 4], "a")
    cm.cache_req(a, finished=False)
    b = admit(cm, [1, 2, 3, 4, 5, 6], "b")  # shares a's 4 tokens, owns 2
    cm.cache_req(b, finished=False)
    b.output_ids = [7]
    grow(cm, b, 1)  # one slot of b's own
    return cm, a, b


def _dup_free(cm, a, b):  # a slot both in the tree and free (the double-free of the old bug)
    cm.token_to_kv_pool.free(torch.tensor(row(cm, a, 1)))


def _leak(cm, a, b):  # a slot nobody owns
    cm.token_to_kv_pool.free_slots = cm.token_to_kv_pool.free_slots[1:]


def _stale_row(cm, a, b):  # the protected range no longer matches the tree path
    cm.req_to_token_pool.req_to_token[b.req_pool_idx, 1] = int(cm.token_to_kv_pool.free_slots[0])


def _lock_leak(cm, a, b):  # a lock nobody holds
    cm.tree_cache.inc_lock_ref(a.last_node)


def _two_owners(cm, a, b):  # b's own slot also in a's range
    cm.req_to_token_pool.req_to_token[a.req_pool_idx, 4] = cm.req_to_token_pool.req_to_token[
        b.req_pool_idx, 6
    ]
    a.output_ids, a.kv_allocated_len, a.kv_committed_len = [8], 5, 5


def _row_shared(cm, a, b):
    b.req_pool_idx = a.req_pool_idx


@pytest.mark.parametrize(
    "corrupt", [_dup_free, _leak, _stale_row, _lock_leak, _two_owners, _row_shared]
)
def test_invariant_check_catches(corrupt):
    cm, a, b = _two_requests()
    check(cm, a, b)
    corrupt(cm, a, b)
    with pytest.raises(InvariantError):
        check(cm, a, b)


def test_invariant_check_catches_a_waiting_request_that_holds_kv():
    cm, a, b = _two_requests()
    with pytest.raises(InvariantError, match="waiting request"):
        check_invariants(cm, [a], [b])


# --- stateful property test -----------------------------------------------------------

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=6)
NAMESPACES = st.sampled_from(
    [None, "tenant-b"]
)  # a request's KV is shared within its namespace only


class CacheManagerMachine(RuleBasedStateMachine):
    """Requests are admitted (match + lock + row), grow by steps (committed, or one in flight),
    are cached while running, truncated, and released. Model: `cached` maps every cached prefix
    to its last token's slot. The invariant check runs after every rule."""

    @initialize()
    def setup(self):
        self.cm = make_manager(kv_size=40, num_reqs=3, max_len=24)
        self.cached: dict[tuple, int] = {}  # (namespace, *token ids) -> the slot of the last token
        self.reqs: list[Req] = []
        self.n = 0

    def model_insert(self, req: Req) -> None:
        ids, slots = req.all_ids(), row(self.cm, req, req.kv_committed_len)
        for i in range(req.kv_committed_len):
            self.cached.setdefault((req.cache_namespace, *ids[: i + 1]), slots[i])

    def model_evicted(self) -> None:
        now = cached_prefixes(self.cm.tree_cache)
        assert now.keys() <= self.cached.keys() and all(self.cached[p] == s for p, s in now.items())
        self.cached = now

    @precondition(lambda self: self.cm.req_to_token_pool.available_size() > 0)
    @rule(key=TOKENS, ns=NAMESPACES)
    def admit(self, key, ns):
        req = new_req(key, f"r{self.n}")
        req.cache_namespace = ns
        self.n += 1
        prefix, node = self.cm.match(req)
        expect = 0
        while expect < len(key) - 1 and (ns, *key[: expect + 1]) in self.cached:
            expect += 1
        assert len(prefix) == expect
        self.cm.lock(node)
        if self.cm.kv_room() < len(key) - len(prefix):
            self.cm.unlock(node)
            return
        self.cm.assign(req, prefix, node)
        grow(self.cm, req, len(key) - len(prefix))
        self.model_evicted()
        self.reqs.append(req)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), more=st.lists(st.integers(0, 3), max_size=3), in_flight=st.booleans())
    def step(self, data, more, in_flight):
        """Outputs arrive; their K/V is computed (or, in flight, only allocated)."""
        req = data.draw(st.sampled_from(self.reqs))
        if req.kv_allocated_len != req.kv_committed_len or not more:
            return
        if req.kv_allocated_len + len(more) > self.cm.req_to_token_pool.max_context_len:
            return
        if self.cm.kv_room() < len(more):
            return
        req.output_ids += more
        grow(self.cm, req, len(more), commit=not in_flight)
        self.model_evicted()

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def cache_unfinished(self, data):
        req = data.draw(st.sampled_from(self.reqs))
        self.model_insert(req)
        self.cm.cache_req(req, finished=False)
        ids = req.all_ids()[: req.kv_committed_len]
        assert req.cache_protected_len == len(ids) and path_key(req.last_node) == ids
        assert row(self.cm, req, len(ids)) == [
            self.cached[(req.cache_namespace, *ids[: i + 1])] for i in range(len(ids))
        ]

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def truncate(self, data):
        """Jump-forward: outputs past `keep` are re-tokenized, their own KV freed."""
        req = data.draw(st.sampled_from(self.reqs))
        lo = max(req.cache_protected_len, len(req.origin_input_ids))
        if req.kv_committed_len != req.kv_allocated_len or lo > req.kv_committed_len:
            return
        keep = data.draw(st.integers(lo, req.kv_committed_len))
        self.cm.free_tail(req, keep)
        req.output_ids = req.output_ids[: keep - len(req.origin_input_ids)]

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def commit(self, data):
        """The step in flight completes."""
        req = data.draw(st.sampled_from(self.reqs))
        req.kv_committed_len = req.kv_allocated_len

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def release(self, data):
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.model_insert(req)
        self.cm.release(req)
        assert not req.holds_kv() and req.last_node is None

    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens):
        self.cm.tree_cache.evict(num_tokens)
        self.model_evicted()

    @invariant()
    def owners_and_tree(self):
        check_invariants(self.cm, self.reqs, [])
        assert cached_prefixes(self.cm.tree_cache) == self.cached


CacheManagerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cache_manager_state_machine = CacheManagerMachine.TestCase
