"""Tree drafts of the lookup sources: the radix source proposes the branches recorded under the
request's context, weighted by how often each was inserted (then recency), in the request's
namespace only; prompt lookup proposes what followed each earlier occurrence of its last tokens."""

from __future__ import annotations

import pytest
import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.radix_cache import RadixCache
from radixlm.config import ServerArgs
from radixlm.engine.launcher import check_server_args
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.req import Req
from radixlm.speculative.config import SpeculativeConfig
from radixlm.speculative.draft_tree import ROOT, TreeShape
from radixlm.speculative.ngram import NgramDraftSource
from radixlm.speculative.radix import RadixDraftSource


def req(ids: list[int], namespace=None) -> Req:
    r = Req(rid="r", origin_input_ids=list(ids), sampling_params=SamplingParams(temperature=0))
    r.cache_namespace = namespace
    return r


def test_radix_branches_weighted_by_insert_counts():
    tree = RadixCache(TokenToKVPool(256, num_layers=1, num_kv_heads=1, head_dim=1))
    slots = iter(range(1, 200))

    def insert(ids, namespace=None):
        tree.insert(PrefixKey(ids, namespace), torch.tensor([next(slots) for _ in ids]))

    for ids in (
        [1, 2, 3, 10, 11, 12],
        [1, 2, 3, 10, 11, 12],
        [1, 2, 3, 10, 20, 21],
        [1, 2, 3, 30, 31],
    ):
        insert(ids)
    insert([1, 2, 3, 99, 98], namespace="tenant")  # another namespace: never drafted for this one
    after = tree.locate(PrefixKey([1, 2, 3]))[0]
    assert [(c.key, c.insert_count) for c in tree.branches(after)] == [([10], 3), ([30, 31], 1)]
    assert [c.key for c in tree.branches(tree.root_node, "tenant")] == [[1, 2, 3, 99, 98]]

    src = RadixDraftSource(tree)
    t = src.draft_for(req([1, 2, 3]), 8, TreeShape(width=4))
    # Best first: 10 (3/4), 11 and 12 (3/4 * 2/3), 30 and 31 (1/4), 20 and 21 (3/4 * 1/3 = 1/4).
    assert t.path_tokens(t.first_path()) == [10, 11, 12]
    assert 99 not in t.tokens and len(t) == 7
    assert t.parents[t.tokens.index(30)] == ROOT and t.ranks[t.tokens.index(30)] == 1
    assert t.tokens[t.parents[t.tokens.index(20)]] == 10 and t.ranks[t.tokens.index(20)] == 1
    # Width 1: the chain of the most taken branches; the other namespace's branch when asked from
    # it.
    chain = src.draft_for(req([1, 2, 3]), 8, TreeShape(width=1))
    assert chain.is_chain and chain.tokens == (10, 11, 12)
    assert src.draft_for(req([1, 2, 3], "tenant"), 8, TreeShape(width=4)).tokens == (99, 98)
    # Inside an edge: its rest first, then the branches below.
    t = src.draft_for(req([1, 2, 3, 10]), 3, TreeShape(width=2))
    assert t.path_tokens(t.first_path()) == [11, 12] and t.tokens[2] == 20


def test_ngram_tree_of_the_earlier_continuations():
    # [7, 8] occurs three times before the end, followed by 1 2 / 1 3 / 2 4.
    ids = [7, 8, 1, 2, 0, 7, 8, 1, 3, 0, 7, 8, 2, 4, 0, 7, 8]
    src = NgramDraftSource(2, 4)
    t, match = src.lookup_tree("a", ids, 6, TreeShape(width=3))
    assert match == 3  # [0, 7, 8]: its latest two occurrences (followed by 1 3 and 2 4)
    t, match = NgramDraftSource(2, 2).lookup_tree("b", ids, 5, TreeShape(width=3))
    assert match == 2
    assert t.tokens[0] == 1 and t.parents[0] == ROOT  # two of three occurrences go on with 1
    # Five nodes: the two levels of the three continuations (1/3 each), before any third level.
    assert sorted(t.path_tokens(t.ancestors(i)) for i in range(len(t)) if not t.children(i)) == [
        [1, 2],
        [1, 3],
        [2, 4],
    ]
    # Width 1 asks for a chain: what followed the latest occurrence, as lookup gives.
    assert src.draft_for(req(ids), 3, TreeShape(width=1)) == src.lookup("a", ids, 3) == [2, 4, 0]


def test_tree_flags_are_validated_and_shape_the_controller(tiny_model_dir):
    """--speculative-eagle-topk / --speculative-num-steps: a bad value is an error naming the
    field before anything starts; the defaults (4 wide for the lookups, chains for the draft
    model; as deep as --speculative-num-draft-tokens) reach the controller."""
    for bad, field in (
        (dict(speculative_eagle_topk=0), "speculative_eagle_topk"),
        (dict(speculative_num_steps=0), "speculative_num_steps"),
        (
            dict(
                speculative_algorithm="draft-model",
                speculative_draft_model_path=tiny_model_dir,
                speculative_eagle_topk=2,
            ),
            "speculative_eagle_topk",
        ),
    ):
        with pytest.raises(ValueError, match=field):
            check_server_args(ServerArgs(**{"speculative_algorithm": "radix", **bad}))
    args = ServerArgs(speculative_algorithm="ngram", speculative_num_draft_tokens=6)
    assert SpeculativeConfig.from_server_args(args).tree_shape == TreeShape(4, 6)
    args = ServerArgs(
        speculative_algorithm="radix", speculative_eagle_topk=2, speculative_num_steps=3
    )
    assert SpeculativeConfig.from_server_args(args).tree_shape == TreeShape(2, 3)
    # --speculative-num-draft-tokens unset: radix up to 64 (a recorded answer verifies in one step),
    # the others 16; a value given wins, and a bad one names the field.
    for algorithm, expected in (("radix", 64), ("ngram", 16)):
        assert (
            SpeculativeConfig.from_server_args(
                ServerArgs(speculative_algorithm=algorithm)
            ).num_draft_tokens
            == expected
        )
    assert (
        SpeculativeConfig.from_server_args(
            ServerArgs(speculative_algorithm="radix", speculative_num_draft_tokens=5)
        ).num_draft_tokens
        == 5
    )
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        check_server_args(ServerArgs(speculative_algorithm="radix", speculative_num_draft_tokens=0))
