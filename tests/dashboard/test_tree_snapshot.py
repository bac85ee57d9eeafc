"""The dashboard's picture of the radix tree (cache/tree_snapshot.py) against a naive trie of the
inserted sequences, and the feed's percentiles against numpy."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.radix_cache import RadixCache
from radixlm.cache.tree_snapshot import tree_snapshot
from radixlm.server.dashboard_feed import FeedRates, percentile


def filled_cache(seqs: list[list[int]]) -> RadixCache:
    pool = TokenToKVPool(4096, num_layers=1, num_kv_heads=1, head_dim=1)
    cache = RadixCache(pool)
    for s in seqs:
        cache.insert(PrefixKey(s), pool.alloc(len(s)))
    return cache


def naive_branch_points(seqs: list[list[int]]) -> dict[tuple, int]:
    """Prefix -> how many distinct next tokens follow it, for every prefix followed by two or more
    (the radix tree's branching nodes end exactly there)."""
    nexts: dict[tuple, set] = {}
    for s in seqs:
        for i in range(len(s)):
            nexts.setdefault(tuple(s[:i]), set()).add(s[i])
    return {p: len(n) for p, n in nexts.items() if len(n) >= 2 and p}


def test_two_requests_sharing_a_prefix_show_the_shared_node_with_both_children():
    shared, a, b = [5, 6, 7, 8], [9, 10, 11], [12, 13]
    nodes = tree_snapshot(filled_cache([shared + a, shared + b]), max_nodes=10, with_token_ids=True)
    by_id = {n["id"]: n for n in nodes}
    top = [n for n in nodes if n["parent"] is None]
    assert len(top) == 1 and top[0]["token_ids"] == shared and top[0]["depth_tokens"] == len(shared)
    kids = sorted((n for n in nodes if n["parent"] == top[0]["id"]), key=lambda n: n["tokens"])
    assert [k["token_ids"] for k in kids] == [b, a] and top[0]["children"] == 2
    assert top[0]["subtree_tokens"] == len(shared) + len(a) + len(b)
    assert all(n["parent"] is None or n["parent"] in by_id for n in nodes)
    assert all(n["lock_ref"] == 0 and n["tier"] == "l1" for n in nodes)
    # Without --dashboard-show-text no token leaves the scheduler.
    assert all(n["token_ids"] is None for n in tree_snapshot(filled_cache([shared + a]), 10))


@pytest.mark.parametrize("seed", range(5))
def test_random_trees_against_a_naive_trie(seed):
    rng = random.Random(seed)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 12))] for _ in range(30)]
    cache = filled_cache(seqs)
    nodes = tree_snapshot(cache, max_nodes=10_000, with_token_ids=True)
    # Every node of the tree is shown; the branching ones sit where the naive trie branches.
    assert len(nodes) == len(cache.all_nodes())
    prefix: dict[int, tuple] = {}
    for n in nodes:  # parents first
        prefix[n["id"]] = (prefix[n["parent"]] if n["parent"] is not None else ()) + tuple(
            n["token_ids"]
        )
        assert len(prefix[n["id"]]) == n["depth_tokens"]
    branching = {prefix[n["id"]]: n["children"] for n in nodes if n["children"] >= 2}
    assert branching == naive_branch_points(seqs)
    assert (
        sum(n["tokens"] for n in nodes)
        == cache.total_size()
        == len({tuple(s[: i + 1]) for s in seqs for i in range(len(s))})
    )
    # Parents come first, and each node's subtree is its own tokens plus its children's subtrees.
    seen = set()
    for n in nodes:
        assert n["parent"] is None or n["parent"] in seen
        seen.add(n["id"])
        kids = [c for c in nodes if c["parent"] == n["id"]]
        assert n["subtree_tokens"] == n["tokens"] + sum(c["subtree_tokens"] for c in kids)
    # A bound keeps the largest: the top level's biggest subtree is always first.
    few = tree_snapshot(cache, max_nodes=3)
    assert len(few) == 3 and few[0]["subtree_tokens"] == max(
        n["subtree_tokens"] for n in nodes if n["parent"] is None
    )
    assert all(n["parent"] is None or n["parent"] in {m["id"] for m in few} for n in few)


def test_locked_nodes_and_lru_order():
    cache = filled_cache([[1, 2, 3], [4, 5]])
    m = cache.match_prefix(PrefixKey([1, 2, 3]))  # touched last: the most recently used
    cache.inc_lock_ref(m.last_node)
    nodes = {tuple(n["token_ids"]): n for n in tree_snapshot(cache, 10, with_token_ids=True)}
    assert nodes[(1, 2, 3)]["lock_ref"] == 1 and nodes[(4, 5)]["lock_ref"] == 0
    assert nodes[(1, 2, 3)]["lru_rank"] == 0 and nodes[(4, 5)]["lru_rank"] == 1


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        v = rng.exponential(size=n).tolist()
        for q in (50, 90, 99):
            assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)), rel=1e-12)
    assert percentile([], 50) is None


def test_rates_from_running_totals():
    clock = iter([10.0, 12.0, 13.0])
    rates = FeedRates(_clock=lambda: next(clock))
    assert (
        rates.update({"generated_tokens": 100, "prompt_tokens": 50})["output_tok_s"] is None
    )  # no previous tick
    r = rates.update({"generated_tokens": 180, "prompt_tokens": 70})
    assert r["output_tok_s"] == 40.0 and r["prompt_tok_s"] == 10.0
    assert (
        rates.update({"generated_tokens": 180, "prompt_tokens": 0})["prompt_tok_s"] is None
    )  # flushed: reset


def test_a_hybrid_models_snapshot_nodes_are_marked():
    import torch

    from radixlm.cache.mamba_radix_cache import MambaRadixCache
    from radixlm.cache.state_pool import MambaPool, StateSpec

    pool = TokenToKVPool(64, num_layers=1, num_kv_heads=1, head_dim=1)
    states = MambaPool([[StateSpec("ssm", (2,), torch.float32)]], rows=1, snapshots=2)
    cache = MambaRadixCache(pool, states)
    cache.insert(PrefixKey([1, 2, 3, 4]), pool.alloc(4))
    cache.attach_state(PrefixKey([1, 2]), states.alloc_snapshot)  # splits: [1, 2] | [3, 4]
    nodes = {tuple(n["token_ids"]): n for n in tree_snapshot(cache, 10, with_token_ids=True)}
    assert nodes[(1, 2)]["snapshot"] and not nodes[(3, 4)]["snapshot"]
    assert not any(n["snapshot"] for n in tree_snapshot(filled_cache([[5, 6]]), 10))
