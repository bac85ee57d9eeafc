"""Scheduling policies give the order they claim, look the tree up without splitting it, and are
not consulted at all while nothing could be admitted; admission follows their order."""

from __future__ import annotations

import random

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.no_prefix_cache import NoPrefixCache
from radixlm.cache.radix_cache import RadixCache
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.batching.policy import LPM_MAX_QUEUE, SchedulePolicy
from radixlm.scheduler.req import Req
from tests.scheduler.harness import Driver, make_scheduler


def tree_with(*seqs: list[int]) -> RadixCache:
    pool = TokenToKVPool(500, num_layers=1, num_kv_heads=1, head_dim=1)
    tree = RadixCache(pool)
    for s in seqs:
        tree.insert(PrefixKey(s), pool.alloc(len(s)))
    return tree


def req(rid: str, ids: list[int], t: float, max_new: int = 8, priority=None) -> Req:
    return Req(
        rid=rid,
        origin_input_ids=ids,
        sampling_params=SamplingParams(max_new_tokens=max_new),
        arrival_time=t,
        priority=priority,
    )


def shape(tree: RadixCache):
    return sorted((tuple(n.key), n.lock_ref) for n in tree.all_nodes())


A, B = list(range(100, 140)), list(range(200, 230))  # two cached documents


def test_lpm_orders_by_cached_prefix_then_arrival_without_splitting():
    tree = tree_with(A, B)
    before = shape(tree)
    queue = [
        req("none", [1, 2, 3], 0.0),
        req("a10", A[:10] + [7, 7], 1.0),
        req("b30", B + [8], 2.0),
        req("a40", A + [9], 3.0),
        req("a10-late", A[:10] + [6], 4.0),
    ]
    lens = SchedulePolicy("lpm", tree).calc_priority(queue)
    assert [r.rid for r in queue] == ["a40", "b30", "a10", "a10-late", "none"]
    assert [lens[id(r)] for r in queue] == [40, 30, 10, 10, 0]
    assert shape(tree) == before  # partial matches inside A's edge split nothing
    assert all(
        r.last_node is None and not r.holds_kv() for r in queue
    )  # nothing written into requests


def test_fcfs_lof_priority_and_random():
    tree = tree_with(A)
    mk = lambda: [
        req(f"r{i}", [i + 1], t, max_new=m)
        for i, (t, m) in enumerate([(3, 5), (1, 50), (2, 20), (0, 5)])
    ]
    q = mk()
    SchedulePolicy("fcfs", tree).calc_priority(q)
    assert [r.rid for r in q] == ["r3", "r1", "r2", "r0"]
    q = mk()
    SchedulePolicy("lof", tree).calc_priority(q)
    assert [r.rid for r in q] == ["r1", "r2", "r3", "r0"]  # longest output first, then arrival
    q = mk()
    q[2].priority, q[0].priority = 5, 1
    SchedulePolicy("fcfs", tree).calc_priority(q)
    assert [r.rid for r in q] == ["r2", "r0", "r3", "r1"]  # priority first, the policy breaks ties
    orders = []
    for seed in (0, 0, 1):
        q = [req(f"r{i}", [i + 1], float(i)) for i in range(12)]
        SchedulePolicy("random", tree, seed=seed).calc_priority(q)
        orders.append([r.rid for r in q])
    assert orders[0] == orders[1] != orders[2]  # seeded
    assert sorted(orders[2]) == sorted(f"r{i}" for i in range(12)) and orders[2] != [
        f"r{i}" for i in range(12)
    ]


def test_lpm_falls_back_to_fcfs_for_long_queues_and_without_cache():
    tree = tree_with(A)
    q = [req(f"r{i}", A + [i] if i % 2 else [i + 1], float(i)) for i in range(LPM_MAX_QUEUE + 1)]
    random.Random(0).shuffle(q)
    assert SchedulePolicy("lpm", tree).calc_priority(q) == {}
    assert [r.arrival_time for r in q] == sorted(r.arrival_time for r in q)
    q = [req("x", [5], 1.0), req("a", A + [1], 2.0)]
    SchedulePolicy("lpm", NoPrefixCache()).calc_priority(q)
    assert [r.rid for r in q] == ["x", "a"]


def test_dfs_weight_runs_heavier_subtrees_first_deepest_match_first():
    # Tree: A (40) with a child A+[1,2,3]; B (30).
    tree = tree_with(A, A + [1, 2, 3], B)
    before = shape(tree)
    queue = [
        req("cold", [9, 9], 0.0),
        req("b1", B + [5], 1.0),
        req("a-only", A[:20] + [4], 2.0),  # ends inside A's edge
        req("a-deep", A + [1, 2, 3, 7], 3.0),
        req("b2", B + [6], 4.0),
        req("a-deep2", A + [1, 2, 3, 8], 5.0),
        req("a-mid", A + [5], 6.0),
    ]
    SchedulePolicy("dfs-weight", tree).calc_priority(queue)
    order = [r.rid for r in queue]
    # A's subtree holds 4 waiting requests, B's 2: A first; inside A its deeper child first; the
    # request matching nothing last.
    assert order == ["a-deep", "a-deep2", "a-only", "a-mid", "b1", "b2", "cold"]
    assert shape(tree) == before


def test_no_ordering_while_nothing_can_be_admitted(tiny_model_dir):
    """A running request's reserve takes the whole KV budget; waiting requests that share cached
    prefixes stay waiting, and the policy is not asked to walk the tree for them (whose splitting
    matches would fragment it) until room appears."""
    rng = random.Random(3)
    d = Driver(make_scheduler(tiny_model_dir, max_total_tokens=200, schedule_policy="lpm"))
    doc = [rng.randrange(3, 40000) for _ in range(60)]
    d.submit(doc + [11], "doc", max_new_tokens=1, temperature=0)
    d.run()  # doc is cached
    calls = []
    calc = d.s.policy.calc_priority
    d.s.policy.calc_priority = lambda q: calls.append(len(q)) or calc(q)
    d.submit([5, 6, 7], "hog", max_new_tokens=1000, temperature=0, ignore_eos=True)
    d.step()  # hog runs; its reserve (0.4 x 999 tokens) exceeds the pool
    assert calls == [1]
    for i in range(4):
        d.submit(doc[: 20 + 10 * i] + [i], f"w{i}", max_new_tokens=1, temperature=0)
    nodes = len(d.s.tree_cache.all_nodes())
    for _ in range(10):
        d.step()
    assert calls == [1] and all(d.results[f"w{i}"].finish_reason is None for i in range(4))
    assert len(d.s.tree_cache.all_nodes()) == nodes
    d.abort("hog")
    d.run()
    assert len(calls) > 1 and all(
        d.results[f"w{i}"].finish_reason["type"] == "length" for i in range(4)
    )


def test_admission_follows_the_policy_order(tiny_model_dir):
    """One request at a time: the waiting requests start (and so finish) in LPM order."""
    rng = random.Random(4)
    d = Driver(make_scheduler(tiny_model_dir, max_running_requests=1, schedule_policy="lpm"))
    doc = [rng.randrange(3, 40000) for _ in range(80)]
    d.submit(doc, "doc", max_new_tokens=1, temperature=0)
    d.run()
    d.submit([9, 9, 9], "blocker", max_new_tokens=6, temperature=0, ignore_eos=True)
    d.step()
    for rid, n in [("p10", 10), ("p70", 70), ("p0", 0), ("p40", 40)]:
        d.submit(
            doc[:n] + [rng.randrange(3, 40000) for _ in range(5)],
            rid,
            max_new_tokens=1,
            temperature=0,
        )
    finished = []
    while not d.idle():
        d.step()
        finished += [
            r
            for r in ("p10", "p70", "p0", "p40")
            if d.results[r].finish_reason and r not in finished
        ]
    assert finished == ["p70", "p40", "p10", "p0"]
    assert [d.results[r].cached_tokens for r in finished] == [70, 40, 10, 0]


def test_a_registered_policy_orders_the_queue_after_priorities():
    """A policy is one registered ordering function (docs/architecture.md's example)."""
    from radixlm.scheduler.batching import policy as policy_mod

    @policy_mod.register_policy("sjf-test")
    def shortest_first(policy, queue, lookup):
        queue.sort(key=lambda r: (r.sampling_params.max_new_tokens, r.arrival_time))

    try:
        q = [
            req("long", [1], 1.0, max_new=50),
            req("short", [2], 2.0, max_new=5),
            req("mid", [3], 3.0, max_new=20),
            req("urgent", [4], 4.0, max_new=90, priority=1),
        ]
        assert (
            SchedulePolicy("sjf-test", tree_with(A)).calc_priority(q) == {}
        )  # not cache-aware: no lookups
        assert [r.rid for r in q] == ["urgent", "short", "mid", "long"]
    finally:
        del policy_mod._REGISTRY["sjf-test"]
