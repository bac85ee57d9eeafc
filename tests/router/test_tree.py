"""The router's approximate radix tree against a naive model: per tenant, the texts sent to it."""

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.router.tree import ApproxRadixTree

TEXTS = st.text(alphabet="abc", max_size=12)  # a small alphabet: many shared prefixes and splits
OPS = st.lists(st.tuples(st.sampled_from(["w1", "w2", "w3"]), TEXTS), max_size=40)


def common(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def naive_match(model: dict[str, list[str]], text: str) -> tuple[int, set[str]]:
    best = {t: max((common(text, x) for x in xs), default=0) for t, xs in model.items()}
    top = max(best.values(), default=0)
    return top, ({t for t, v in best.items() if v == top} if top else set())


def chars(tree: ApproxRadixTree) -> dict[str, int]:
    out, stack = {}, list(tree.root.children.values())
    while stack:
        node = stack.pop()
        for t in node.tenants:
            out[t] = out.get(t, 0) + len(node.key)
            assert (
                node.parent is tree.root or t in node.parent.tenants
            )  # a tenant is on every ancestor
        assert node.tenants, "a node no tenant holds is pruned"
        stack.extend(node.children.values())
    return out


@settings(max_examples=300, deadline=None)
@given(OPS, st.lists(TEXTS, max_size=10))
def test_matches_equal_the_naive_model(ops, queries):
    tree, model = ApproxRadixTree(), {}
    for i, (tenant, text) in enumerate(ops):
        tree.insert(text, tenant, now=float(i))
        model.setdefault(tenant, []).append(text)
    assert {t: c for t, c in chars(tree).items() if c} == {
        t: c for t, c in tree.tenant_chars.items() if c
    }
    for q in queries + [text for _, text in ops]:
        n, tenants = tree.prefix_match(q, now=1e9)
        ref_n, ref_tenants = naive_match(model, q)
        assert n == ref_n and set(tenants) == ref_tenants, (q, n, tenants, ref_n, ref_tenants)
        for t in ("w1", "w2", "w3"):
            assert tree.prefix_match_tenant(q, t) == naive_match({t: model.get(t, [])}, q)[0]


@settings(max_examples=200, deadline=None)
@given(OPS, st.sampled_from(["w1", "w2", "w3"]))
def test_removing_a_tenant_forgets_only_it(ops, gone):
    tree, model = ApproxRadixTree(), {}
    for i, (tenant, text) in enumerate(ops):
        tree.insert(text, tenant, now=float(i))
        model.setdefault(tenant, []).append(text)
    tree.remove_tenant(gone)
    model.pop(gone, None)
    chars(tree)  # invariants: no tenantless node, tenants on ancestors
    assert gone not in tree.tenant_chars
    for _, q in ops:
        n, tenants = tree.prefix_match(q, now=1e9)
        assert (n, set(tenants)) == naive_match(model, q)


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(min_value=1, max_value=20))
def test_eviction_keeps_each_tenant_under_the_bound_and_its_latest_text(ops, max_size):
    tree, model, latest = ApproxRadixTree(), {}, {}
    for i, (tenant, text) in enumerate(ops):
        tree.insert(text, tenant, now=float(i))
        model.setdefault(tenant, []).append(text)
        latest[tenant] = text
    before = dict(tree.tenant_chars)
    removed = tree.evict_tenant_by_size(max_size)
    after = chars(tree)
    for tenant, c in before.items():
        assert tree.tenant_chars[tenant] == after.get(tenant, 0) == c - removed.get(tenant, 0)
        assert tree.tenant_chars[tenant] <= max_size or c <= max_size
        if c <= max_size:
            assert tenant not in removed  # under the bound: untouched
        # What is left was sent there; the most recent text survives whenever it fits.
        for q in model[tenant]:
            assert tree.prefix_match_tenant(q, tenant) <= naive_match({tenant: model[tenant]}, q)[0]
        if len(latest[tenant]) <= max_size:
            assert tree.prefix_match_tenant(latest[tenant], tenant) == len(latest[tenant])


def test_lru_order_and_splits():
    tree = ApproxRadixTree()
    tree.insert("system prompt A: question 1", "w1", now=1)
    tree.insert("system prompt A: question 2", "w1", now=2)
    tree.insert("system prompt B", "w2", now=3)
    assert tree.prefix_match("system prompt A: question 3", now=4) == (
        len("system prompt A: question "),
        ["w1"],
    )
    assert tree.prefix_match("system prompt C", now=5)[0] == len("system prompt ")
    assert set(tree.prefix_match("system prompt C", now=5)[1]) == {"w1", "w2"}
    # w1 over its bound: question 1 (older) goes first.
    tree.evict_tenant_by_size(len("system prompt A: question 2"))
    assert tree.prefix_match_tenant("system prompt A: question 1", "w1") == len(
        "system prompt A: question "
    )
    assert tree.prefix_match_tenant("system prompt A: question 2", "w1") == len(
        "system prompt A: question 2"
    )
