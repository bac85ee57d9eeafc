"""Each policy's choice under given loads and cache contents."""

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.router.policies import (
    CacheAwareConfig,
    CacheAwarePolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    make_policy,
)

W = ["http://a", "http://b", "http://c"]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_round_robin_cycles():
    p = RoundRobinPolicy()
    assert [p.select(W, {}, "x") for _ in range(7)] == W * 2 + W[:1]


def test_random_covers_every_worker_and_power_of_two_takes_the_less_loaded():
    r = RandomPolicy(seed=0)
    assert set(r.select(W, {}, "x") for _ in range(200)) == set(W)
    p = PowerOfTwoPolicy(seed=0)
    loads = {"http://a": 5, "http://b": 0, "http://c": 9}
    picks = collections.Counter(p.select(W, loads, "x") for _ in range(300))
    assert "http://c" not in picks  # c is never the less loaded of any pair
    assert (
        picks["http://b"] > picks["http://a"]
    )  # b wins both pairs it is in, a only the pair with c
    assert PowerOfTwoPolicy().select(W[:1], {}, "x") == W[0]


def test_cache_aware_follows_the_cached_prefix():
    p = CacheAwarePolicy(CacheAwareConfig(cache_threshold=0.5), clock=Clock())
    doc_a, doc_b = "A" * 200 + " document one. ", "B" * 200 + " document two. "
    first_a = p.select(W, {}, doc_a + "q1")
    first_b = p.select(W, {first_a: 1}, doc_b + "q1")  # a miss: the least loaded, not a's worker
    assert first_b != first_a
    # Later questions on each document go where it is cached, whatever the (balanced) loads.
    loads = {first_a: 3, first_b: 2}
    assert p.select(W, loads, doc_a + "q2") == first_a
    assert p.select(W, loads, doc_b + "q2") == first_b
    assert p.decisions["cache_hit"] == 2 and p.decisions["cache_miss"] == 2


def test_cache_aware_miss_goes_to_the_least_loaded_not_the_smallest_tree():
    p = CacheAwarePolicy(CacheAwareConfig(cache_threshold=0.5), clock=Clock())
    p.select(["http://a"], {}, "x" * 1000)  # a holds a big tree, b and c none
    assert p.select(W, {"http://a": 0, "http://b": 4, "http://c": 4}, "unrelated") == "http://a"


def test_cache_aware_below_threshold_is_a_miss():
    p = CacheAwarePolicy(CacheAwareConfig(cache_threshold=0.8), clock=Clock())
    p.select(["http://a"], {}, "shared prefix " + "x" * 10)
    # 14 + 10 of 40 characters match (60%): below 80%, the least loaded worker.
    assert p.select(W, {"http://a": 1}, "shared prefix " + "x" * 10 + "y" * 16) == "http://b"


@pytest.mark.parametrize(
    "loads,imbalanced",
    [
        ({"http://a": 40, "http://b": 5, "http://c": 6}, True),  # 35 > 32 and 40 > 5 x 1.5
        ({"http://a": 37, "http://b": 5, "http://c": 6}, False),  # 32 apart: not more than 32
        ({"http://a": 100, "http://b": 67, "http://c": 80}, False),  # 33 apart but 100 < 67 x 1.5
        ({"http://a": 101, "http://b": 67, "http://c": 80}, True),
    ],
)
def test_imbalance_needs_both_thresholds(loads, imbalanced):
    p = CacheAwarePolicy(
        CacheAwareConfig(balance_abs_threshold=32, balance_rel_threshold=1.5), clock=Clock()
    )
    p.select(["http://a"], {}, "the cached prompt")
    assert p.is_imbalanced(W, loads) == imbalanced
    # The cached worker (a) is the busiest: imbalance sends the request to the least loaded.
    want = "http://b" if imbalanced else "http://a"
    assert p.select(W, loads, "the cached prompt") == want


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(alphabet="ab", max_size=8),
            st.dictionaries(st.sampled_from(W), st.integers(0, 50)),
        ),
        max_size=30,
    )
)
def test_cache_aware_choice_is_always_a_listed_worker_and_a_tenant_after(reqs):
    p = CacheAwarePolicy(CacheAwareConfig(balance_abs_threshold=4), clock=Clock())
    for text, loads in reqs:
        w = p.select(W, loads, text)
        assert w in W
        assert p.tree.prefix_match_tenant(text, w) == len(text)
        if p.is_imbalanced(W, loads):
            assert loads.get(w, 0) == min(loads.get(x, 0) for x in W)


def test_removed_worker_is_forgotten_and_eviction_runs_on_its_interval():
    clock = Clock()
    p = CacheAwarePolicy(CacheAwareConfig(max_tree_size=10, eviction_interval_secs=5), clock=clock)
    p.select(["http://a"], {}, "a long prompt that the tree holds")
    p.maintain()  # too early: nothing trimmed
    assert p.tree.tenant_chars["http://a"] > 10
    clock.t += 10
    p.maintain()
    assert p.tree.tenant_chars["http://a"] <= 10
    p.remove_worker("http://a")
    assert p.tree.prefix_match("a long prompt", now=clock())[0] == 0


def test_bad_names_and_configs_are_refused():
    with pytest.raises(ValueError, match="policy must be one of"):
        make_policy("fastest")
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareConfig(cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        CacheAwareConfig(balance_rel_threshold=0.5)


def test_the_router_imports_nothing_of_the_engine():
    """radixlm/router/ is its own layer: a machine that only routes needs no torch, no model
    code."""
    import subprocess
    import sys

    code = (
        "import sys, radixlm.router.launch, radixlm.router.server; bad = [m for m in sys.modules if"
        " m == 'torch' or m.startswith(('radixlm.engine', 'radixlm.model', 'radixlm.scheduler',"
        " 'radixlm.server', 'radixlm.cache', 'radixlm.kernels'))]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", out
