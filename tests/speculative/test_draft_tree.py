"""DraftTree: the shape every tree draft source returns and tree verification reads."""

import pytest

from radixlm.speculative.draft_tree import ROOT, DraftTree


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
