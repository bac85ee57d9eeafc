"""DraftTree: the shape every tree draft source returns and tree verification reads."""

import pytest

from radixlm.speculative.draft_tree import ROOT, DraftTree, TreeShape, trie_children


def test_tree_depths_children_and_paths():
    t = DraftTree((5, 6, 7, 8), (ROOT, ROOT, 0, 2))
    assert t.depths == (1, 1, 2, 3) and t.depth == 3
    assert t.children(ROOT) == [0, 1] and t.children(0) == [2] and t.children(1) == []
    assert t.ancestors(3) == [0, 2, 3] and t.path_tokens(t.ancestors(3)) == [5, 7, 8]
    assert not t.is_chain


def test_chain_is_a_tree_of_one_path():
    c = DraftTree.chain([4, 9, 2])
    assert c.is_chain and c.parents == (ROOT, 0, 1) and c.ancestors(2) == [0, 1, 2]
    assert len(DraftTree.empty()) == 0 and DraftTree.empty().depth == 0


@pytest.mark.parametrize("tokens,parents", [((1,), (0,)), ((1, 2), (ROOT, 2)), ((1,), ())])
def test_bad_trees_are_refused(tokens, parents):
    with pytest.raises(ValueError, match="parent"):
        DraftTree(tokens, parents)


def test_ranks_first_path_select_and_bounded():
    t = DraftTree((5, 6, 7, 8, 9), (ROOT, ROOT, 0, 0, 2))
    assert t.ranks == (0, 1, 0, 1, 0)
    assert t.first_path() == [0, 2, 4] and DraftTree.empty().first_path() == []
    s = t.select([0, 3, 1])
    assert (s.tokens, s.parents) == ((5, 6, 8), (ROOT, ROOT, 0))
    with pytest.raises(ValueError, match="without its parent"):
        t.select([4])
    b = t.bounded(TreeShape(width=1, depth=2), 10)  # first children only, two levels
    assert (b.tokens, b.parents) == ((5, 7), (ROOT, 0))
    b = t.bounded(TreeShape(width=2, depth=10), 3)  # the first three nodes in index order
    assert (b.tokens, b.parents) == ((5, 6, 7), (ROOT, ROOT, 0))
    c = t.with_chain(3, [1, 2])
    assert c.parents[5:] == (3, 5) and c.ancestors(6) == [0, 3, 5, 6]


def test_grow_takes_the_most_likely_nodes_best_first():
    """Paths 'a b c' x3, 'a d' x1, 'e' x1 (weights 3, 1, 1): best first by path probability —
    a (4/5), a-b (3/5), a-b-c (3/5), then a-d and e (1/5); width 1 keeps the first children only."""
    paths = [((1, 2, 3), 3.0), ((1, 4), 1.0), ((5,), 1.0)]
    root, children = trie_children(paths)
    t = DraftTree.grow(root, children, 10, TreeShape(width=4))
    assert t.tokens[:3] == (1, 2, 3) and t.parents[:3] == (ROOT, 0, 1)
    assert sorted(t.tokens[3:]) == [4, 5] and len(t) == 5
    assert t.ranks[t.tokens.index(5)] == 1 and t.ranks[t.tokens.index(4)] == 1
    assert DraftTree.grow(root, children, 10, TreeShape(width=1)).tokens == (1, 2, 3)
    assert DraftTree.grow(root, children, 2, TreeShape(width=4)).tokens == (1, 2)
    assert DraftTree.grow(root, children, 10, TreeShape(width=4, depth=1)).tokens == (1, 5)
