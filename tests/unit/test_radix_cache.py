"""RadixCache: unit tests plus a stateful property test against a naive model. (Moving KV between
requests and the tree is the cache manager's: tests/unit/test_cache_manager.py.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.no_prefix_cache import NoPrefixCache
from radixlm.cache.radix_cache import RadixCache, TreeNode
from radixlm.speculative.radix import RadixDraftSource

KV_SIZE = 64


def make_cache(kv_size: int = KV_SIZE):
    kv_pool = TokenToKVPool(kv_size, num_layers=1, num_kv_heads=1, head_dim=1)
    return RadixCache(kv_pool), kv_pool


def K(ids, namespace=None) -> PrefixKey:
    return PrefixKey(list(ids), namespace)


def t(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def path_key(node: TreeNode) -> list[int]:
    """The full token sequence from the root to the end of `node`, via parent links."""
    parts = []
    while node.parent is not None:
        assert node.parent.children[node.lookup_key()] is node, "parent/child links disagree"
        assert node.parent.parent is None or node.parent.namespace == node.namespace, (
            "a namespace changes on a path"
        )
        parts.append(node.key)
        node = node.parent
    return [tok for part in reversed(parts) for tok in part]


def tree_slots(cache: RadixCache) -> list[int]:
    return [s for n in cache.all_nodes() for s in n.value.tolist()]


def cached_prefixes(cache: RadixCache) -> dict[tuple, int]:
    """Every non-empty cached prefix, as (namespace, *token ids) -> the slot of its last token."""
    out: dict[tuple, int] = {}

    def visit(node: TreeNode, prefix: tuple) -> None:
        for child in node.children.values():
            assert len(child.key) == len(child.value) > 0
            start = prefix if prefix else (child.namespace,)
            for tok, slot in zip(child.key, child.value.tolist()):
                start = start + (tok,)
                out[start] = slot
            visit(child, start)

    visit(cache.root_node, ())
    return out


def insert_fresh(cache: RadixCache, kv_pool: TokenToKVPool, key: list[int]) -> int:
    """Insert `key` with fresh slots and free the duplicates, as a request would."""
    value = kv_pool.alloc(len(key))
    prefix_len = cache.insert(K(key), value)
    kv_pool.free(value[:prefix_len])
    return prefix_len


# --- match / insert / split ------------------------------------------------------


def test_partial_match_splits_edge():
    cache, _ = make_cache()
    cache.insert(K([1, 2, 3, 4]), t([10, 11, 12, 13]))
    (node,) = cache.root_node.children.values()
    assert node.key == [1, 2, 3, 4]

    values, last = cache.match_prefix(K([1, 2, 9]))
    assert values.tolist() == [10, 11]
    assert values.dtype == torch.int64
    # The edge [1,2,3,4] became [1,2] -> [3,4]; the returned node ends at the match.
    assert last.key == [1, 2] and last.value.tolist() == [10, 11]
    assert last.parent is cache.root_node and cache.root_node.children[1] is last
    (lower,) = last.children.values()
    assert lower is node and lower.key == [3, 4] and lower.value.tolist() == [12, 13]
    assert lower.parent is last and last.children[3] is lower
    assert cache.total_size() == 4 == cache.evictable_size()


def test_match_ending_on_node_boundary_does_not_split():
    cache, _ = make_cache()
    cache.insert(K([1, 2]), t([10, 11]))
    cache.insert(K([1, 2, 3]), t([20, 21, 22]))
    values, last = cache.match_prefix(K([1, 2, 3, 4]))
    assert values.tolist() == [10, 11, 22]
    assert last.key == [3] and path_key(last) == [1, 2, 3]
    values, last = cache.match_prefix(K([1, 2]))
    assert values.tolist() == [10, 11] and last.key == [1, 2] and len(last.children) == 1


def test_match_miss_and_empty_key():
    cache, _ = make_cache()
    cache.insert(K([1, 2]), t([10, 11]))
    for key in ([], [2, 1], [3]):
        values, last = cache.match_prefix(K(key))
        assert values.numel() == 0 and values.dtype == torch.int64
        assert last is cache.root_node


def test_insert_returns_already_present_prefix_len_and_keeps_old_values():
    cache, _ = make_cache()
    assert cache.insert(K([1, 2, 3]), t([10, 11, 12])) == 0
    assert cache.insert(K([1, 2, 3]), t([20, 21, 22])) == 3
    assert cache.insert(K([1, 2, 4, 5]), t([30, 31, 32, 33])) == 2  # splits [1,2,3]
    assert cache.insert(K([1]), t([40])) == 1  # ends inside an edge: split, nothing new
    assert cache.insert(K([7]), t([50])) == 0
    assert cache.total_size() == 6  # 1,2 | 3 | 4,5 | 7
    assert cache.match_prefix(K([1, 2, 3]))[0].tolist() == [10, 11, 12]
    assert cache.match_prefix(K([1, 2, 4, 5]))[0].tolist() == [10, 11, 32, 33]
    assert cache.match_prefix(K([7, 7]))[0].tolist() == [50]
    assert sorted(n.key[0] for n in cache.root_node.children.values()) == [1, 7]


def test_insert_does_not_alias_caller_tensor():
    cache, _ = make_cache()
    value = t([10, 11, 12])
    cache.insert(K([1, 2, 3]), value)
    value[:] = -1
    assert cache.match_prefix(K([1, 2, 3]))[0].tolist() == [10, 11, 12]


# --- eviction and locking ----------------------------------------------------------


def test_evict_lru_leaves_in_order():
    cache, kv_pool = make_cache()
    for key in ([1, 1], [2, 2, 2], [3]):
        insert_fresh(cache, kv_pool, key)
    cache.match_prefix(K([1, 1]))  # [1,1] is now the most recently used
    free_before = kv_pool.available_size()

    assert cache.evict(1) == 3  # LRU leaf [2,2,2], evicted whole
    assert cache.match_prefix(K([2]))[0].numel() == 0
    assert cache.evict(1) == 1  # then [3]
    assert cache.match_prefix(K([3]))[0].numel() == 0
    assert cache.match_prefix(K([1, 1]))[0].numel() == 2
    assert kv_pool.available_size() == free_before + 4
    assert cache.evictable_size() == cache.total_size() == 2


def test_evict_only_leaves_then_parent_becomes_leaf():
    cache, kv_pool = make_cache()
    insert_fresh(cache, kv_pool, [1, 2])
    insert_fresh(cache, kv_pool, [1, 2, 3])  # [1,2] -> [3]
    insert_fresh(cache, kv_pool, [4])
    cache.match_prefix(K([1, 2]))  # the inner node [1,2] is newer than [4]; leaf [3] is oldest
    # [3] goes first (a leaf, oldest), even though evicting [1,2] alone would cover 2 tokens.
    assert cache.evict(1) == 1
    assert cache.match_prefix(K([1, 2, 3]))[0].numel() == 2
    # [1,2] is now a leaf but newer than [4].
    assert cache.evict(1) == 1
    assert cache.match_prefix(K([4]))[0].numel() == 0 and cache.total_size() == 2
    assert cache.evict(100) == 2  # asks for more than exists: frees all, stops
    assert cache.total_size() == 0 and kv_pool.available_size() == KV_SIZE


def test_locked_node_and_ancestors_never_evicted():
    cache, kv_pool = make_cache()
    insert_fresh(cache, kv_pool, [1, 2])
    insert_fresh(cache, kv_pool, [1, 2, 3, 4])
    insert_fresh(cache, kv_pool, [1, 2, 5])
    insert_fresh(cache, kv_pool, [6])
    _, node = cache.match_prefix(K([1, 2, 3, 4]))
    assert cache.inc_lock_ref(node) == -4
    assert cache.evict(100) == 2  # only [5] and [6]
    assert cache.match_prefix(K([1, 2, 3, 4]))[0].numel() == 4 and path_key(node) == [1, 2, 3, 4]
    assert cache.evictable_size() == 0 and cache.protected_size() == 4 == cache.total_size()
    assert cache.dec_lock_ref(node) == 4
    assert cache.evict(100) == 4 and cache.total_size() == 0
    assert kv_pool.available_size() == KV_SIZE


def test_lock_accounting_and_split_under_lock():
    cache, _ = make_cache()
    cache.insert(K([1, 2, 3, 4]), t([10, 11, 12, 13]))
    cache.insert(K([1, 2, 7]), t([10, 11, 14]))
    _, deep = cache.match_prefix(K([1, 2, 3, 4]))
    _, shallow = cache.match_prefix(K([1, 2]))
    assert cache.inc_lock_ref(deep) == -4  # [3,4] and [1,2] go 0 -> 1
    assert cache.inc_lock_ref(shallow) == 0  # [1,2] goes 1 -> 2: no change
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (1, 4, 5)
    assert shallow.lock_ref == 2 and deep.lock_ref == 1

    # A split of a locked edge keeps the lock on both halves and the sizes unchanged.
    _, mid = cache.match_prefix(K([1, 2, 3, 9]))
    assert mid.key == [3] and mid.lock_ref == 1 and deep.key == [4] and deep.parent is mid
    assert (cache.evictable_size(), cache.protected_size()) == (1, 4)

    assert cache.dec_lock_ref(deep) == 2  # [3] and [4] go 1 -> 0; [1,2] stays locked
    assert (cache.evictable_size(), cache.protected_size()) == (3, 2)
    assert cache.dec_lock_ref(shallow) == 2
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (5, 0, 5)
    assert cache.inc_lock_ref(cache.root_node) == 0  # locking the root is a no-op
    assert cache.dec_lock_ref(cache.root_node) == 0
    with pytest.raises(AssertionError):
        cache.dec_lock_ref(shallow)


def test_reset():
    cache, _ = make_cache()
    cache.insert(K([1, 2, 3]), t([10, 11, 12]))
    cache.inc_lock_ref(cache.match_prefix(K([1, 2, 3]))[1])
    cache.reset()
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (0, 0, 0)
    assert cache.match_prefix(K([1, 2, 3]))[0].numel() == 0
    assert cache.insert(K([1, 2, 3]), t([20, 21, 22])) == 0


def test_match_without_split_leaves_the_tree_as_it_is():
    cache, _ = make_cache()
    cache.insert(K([1, 2, 3, 4]), t([10, 11, 12, 13]))
    (node,) = cache.root_node.children.values()
    values, last = cache.peek_prefix(K([1, 2, 9]))
    assert values.tolist() == [10, 11]
    assert last is node and node.key == [1, 2, 3, 4] and len(cache.all_nodes()) == 1  # no split
    values, last = cache.match_prefix(K([1, 2, 9]))  # the splitting match agrees on the slots
    assert values.tolist() == [10, 11] and last.key == [1, 2] and len(cache.all_nodes()) == 2


def test_disabled_mode_caches_nothing():
    cache = NoPrefixCache()
    with pytest.raises(TypeError):  # the cache manager keeps a request's KV itself (NoCacheManager)
        cache.insert(K([1, 2, 3]), t([1, 2, 3]))
    assert cache.total_size() == 0 and not cache.capabilities().shares_prefixes
    for lookup in (cache.match_prefix, cache.peek_prefix):
        values, node = lookup(K([1, 2, 3]))
        assert values.numel() == 0 and node is cache.root_node
    assert cache.evict(10) == 0
    assert cache.inc_lock_ref(cache.root_node) == 0 and cache.dec_lock_ref(cache.root_node) == 0


def test_path_to_gives_the_ids_and_slots_from_the_root():
    cache, _ = make_cache()
    cache.insert(K([1, 2, 3]), t([10, 11, 12]))
    cache.insert(K([1, 2, 5, 6]), t([10, 11, 20, 21]))
    _, node = cache.match_prefix(K([1, 2, 5, 6]))
    ids, slots = cache.path_to(node)
    assert ids == [1, 2, 5, 6] and slots.tolist() == [10, 11, 20, 21]
    ids, slots = cache.path_to(cache.root_node)
    assert ids == [] and slots.numel() == 0


# --- stateful property test against a naive model -----------------------------------

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=6)
NAMESPACES = st.sampled_from([None, "adapter-a"])  # the same tokens in two namespaces never share


class RadixCacheMachine(RuleBasedStateMachine):
    """Model: `cached` maps every cached prefix (a tuple) to its last token's slot.

    Prefix-closed by construction, so "longest common prefix with any cached sequence"
    is the longest prefix of the key found in it.
    """

    @initialize()
    def setup(self):
        self.cache, self.kv_pool = make_cache(kv_size=40)
        self.cached: dict[tuple[int, ...], int] = {}
        self.locks: list[tuple[TreeNode, tuple[int, ...]]] = []

    # helpers
    def model_match_len(self, key, ns) -> int:
        n = 0
        while n < len(key) and (ns, *key[: n + 1]) in self.cached:
            n += 1
        return n

    def model_insert(self, key, ns, value: list[int]) -> None:
        for i in range(len(key)):
            self.cached.setdefault((ns, *key[: i + 1]), value[i])

    def model_slots(self, key, ns, n) -> list[int]:
        return [self.cached[(ns, *key[: i + 1])] for i in range(n)]

    def pinned(self) -> set[tuple]:
        paths = [p for _, p in self.locks]
        return {p[: i + 2] for p in paths for i in range(len(p) - 1)}

    def alloc(self, n: int):
        value = self.kv_pool.alloc(n)
        if value is None:
            self.do_evict(n - self.kv_pool.available_size())
            value = self.kv_pool.alloc(n)
        return value

    def do_evict(self, num_tokens: int) -> int:
        before = dict(self.cached)
        free_before = set(self.kv_pool.free_slots.tolist())
        evictable_before = self.cache.evictable_size()
        freed = self.cache.evict(num_tokens)
        self.cached = cached_prefixes(self.cache)
        removed = before.keys() - self.cached.keys()
        assert self.cached.keys() <= before.keys()
        assert all(before[p] == s for p, s in self.cached.items())
        assert freed == len(removed) <= evictable_before
        assert freed >= num_tokens or self.cache.evictable_size() == 0
        assert not (removed & self.pinned()), "a locked node was evicted"
        assert set(self.kv_pool.free_slots.tolist()) - free_before == {before[p] for p in removed}
        return freed

    # rules
    @rule(key=TOKENS, ns=NAMESPACES)
    def insert(self, key, ns):
        value = self.alloc(len(key))
        if value is None:
            return
        expected = self.model_match_len(key, ns)
        assert self.cache.insert(K(key, ns), value) == expected
        self.kv_pool.free(value[:expected])
        self.model_insert(key, ns, value.tolist())

    @rule(key=TOKENS, ns=NAMESPACES)
    def match(self, key, ns):
        values, node = self.cache.match_prefix(K(key, ns))
        n = self.model_match_len(key, ns)
        assert values.tolist() == self.model_slots(key, ns, n)
        assert path_key(node) == key[:n]
        assert n == 0 or node.namespace == ns

    @rule(key=TOKENS, ns=NAMESPACES)
    def lock(self, key, ns):
        _, node = self.cache.match_prefix(K(key, ns))
        self.cache.inc_lock_ref(node)
        self.locks.append((node, (node.namespace, *path_key(node))))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.locks) - 1))
        node, _ = self.locks.pop(i)
        self.cache.dec_lock_ref(node)

    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens):
        self.do_evict(num_tokens)

    @rule(key=TOKENS, ns=NAMESPACES)
    def match_without_split(self, key, ns):
        shape = [(n.id, len(n.key)) for n in self.cache.all_nodes()]
        values, node = self.cache.peek_prefix(K(key, ns))
        n = self.model_match_len(key, ns)
        assert values.tolist() == self.model_slots(key, ns, n)
        assert path_key(node)[:n] == key[:n]  # the node reached may extend past the match
        assert [(m.id, len(m.key)) for m in self.cache.all_nodes()] == shape

    # invariants (checked after every step)
    @invariant()
    def sizes_and_conservation(self):
        cache = self.cache
        assert (
            cache.evictable_size() + cache.protected_size()
            == cache.total_size()
            == len(self.cached)
        )
        assert cache.protected_size() == len(self.pinned())
        assert (
            sum(len(n.value) for n in cache.all_nodes() if n.lock_ref > 0) == cache.protected_size()
        )
        assert self.kv_pool.available_size() + cache.total_size() == self.kv_pool.size

    @invariant()
    def tree_matches_model_and_slots_unique(self):
        assert cached_prefixes(self.cache) == self.cached
        owned = tree_slots(self.cache) + self.kv_pool.free_slots.tolist()
        assert len(owned) == len(set(owned)) == self.kv_pool.size, "a slot is lost or owned twice"

    @invariant()
    def locked_nodes_still_attached(self):
        for node, path in self.locks:
            assert (node.namespace, *path_key(node)) == path and node.lock_ref > 0


RadixCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_radix_cache_state_machine = RadixCacheMachine.TestCase


def test_continuation_follows_the_most_recently_used_branch():
    cache, _ = make_cache()
    cache.insert(K([1, 2, 3, 4, 5, 6]), t([1, 2, 3, 4, 5, 6]))
    cache.insert(K([1, 2, 3, 9, 9]), t([7, 8, 9, 10, 11]))
    before = [(n.key, n.last_access_time) for n in cache.all_nodes()]
    assert cache.continuation(K([1, 2]), 3) == [
        3,
        9,
        9,
    ]  # the later insert is the most recent branch
    assert [(n.key, n.last_access_time) for n in cache.all_nodes()] == before, (
        "a draft lookup changed the tree"
    )
    cache.match_prefix(K([1, 2, 3, 4, 5, 6]))
    assert cache.continuation(K([1, 2]), 3) == [3, 4, 5]
    assert cache.continuation(K([1, 2, 3, 4]), 10) == [5, 6]
    assert cache.continuation(K([1, 7]), 3) == []  # leaves the tree
    assert cache.continuation(K([1, 2, 3, 4, 5, 6]), 3) == []  # nothing cached after it
    assert cache.continuation(K([1, 2, 3, 4, 5, 6, 7]), 3) == []
    _, node = cache.match_prefix(K([1, 2, 3]))
    assert cache.continuation(K([9]), 4, node) == [9]
    assert cache.continuation(K([]), 2, node) in ([4, 5], [9, 9])
    with pytest.raises(ValueError, match="radix cache"):  # no tree, no drafts from it
        RadixDraftSource(NoPrefixCache())


def test_namespaces_never_share_kv():
    cache, _ = make_cache()
    assert cache.insert(K([1, 2, 3]), t([10, 11, 12])) == 0
    assert cache.insert(K([1, 2, 3], "lora-a"), t([20, 21, 22])) == 0  # same tokens, own KV
    assert cache.insert(K([1, 2, 4], "lora-a"), t([20, 21, 23])) == 2  # shares within its namespace
    assert cache.match_prefix(K([1, 2, 3])).indices.tolist() == [10, 11, 12]
    assert cache.match_prefix(K([1, 2, 3], "lora-a")).indices.tolist() == [20, 21, 22]
    assert cache.match_prefix(K([1, 2, 3], "lora-b")).indices.numel() == 0
    assert cache.continuation(K([1], "lora-a"), 2) in ([2, 3], [2, 4])
    assert cache.continuation(K([1], "lora-b"), 2) == []
    assert cache.total_size() == 7
