"""Drafts under a grammar: cut where the grammar rejects, and one mask per verify row.

A constrained request drafts like any other; its draft tree loses every node whose token its
matcher rejects after the node's path (with the node's subtree: that token could never be emitted
there), and verification masks the root's row with the matcher's state now and node i's row with
its state after node i's path, exactly the mask decoding would have used at that position. The
matcher is walked down each path for that (depth first) and rolled back at once: the emitted tokens
then advance it the usual way (one accept_token each), so nothing that was not accepted stays in
its state. A chain is the tree of one path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.speculative.draft_tree import ROOT, DraftTree


def _walk(
    grammar, tree: DraftTree, visit: Callable[[int], None], on_reject: Callable[[int], None]
) -> None:
    """Depth first over tree with the matcher along each path: visit(node) runs with the matcher
    after node's path (ROOT first, as it is); a node whose token it rejects is on_reject'ed and its
    subtree skipped. The matcher ends as it started, whatever is raised."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, []).append(i)
    depth = 0
    try:
        visit(ROOT)
        stack = [(ROOT, iter(kids.get(ROOT, ())))]
        while stack:
            node, it = stack[-1]
            child = next(it, None)
            if child is None:
                stack.pop()
                if node != ROOT:
                    grammar.rollback(1)
                    depth -= 1
                continue
            if not grammar.accept_token(tree.tokens[child]):
                on_reject(child)
                continue
            depth += 1
            visit(child)
            stack.append((child, iter(kids.get(child, ()))))
    finally:
        if depth:
            grammar.rollback(depth)


def cut_tree(grammar, tree: DraftTree) -> DraftTree:
    """The nodes of tree whose whole path grammar accepts; the matcher is left as it was."""
    keep: list[int] = []
    _walk(grammar, tree, lambda n: keep.append(n) if n != ROOT else None, lambda n: None)
    return tree if len(keep) == len(tree) else tree.select(keep)


def masked_tree_rows(backend, grammar, tree: DraftTree, rows: torch.Tensor) -> torch.Tensor:
    """rows [1 + len(tree), vocab] with row 1 + i's disallowed tokens at -inf after node i's path
    (row 0: the root's, the matcher as it is); a copy. tree must be one cut_tree returned."""
    mask = backend.allocate_vocab_mask(rows.shape[1], rows.shape[0])

    def rejected(node: int) -> None:
        raise RuntimeError(
            f"the grammar rejects draft token {tree.tokens[node]} it accepted when cut"
        )

    _walk(grammar, tree, lambda n: grammar.fill_vocab_mask(mask, n + 1), rejected)
    rows = rows.clone()
    backend.apply_vocab_mask(rows, backend.move_vocab_mask(mask, rows.device))
    return rows


def cut_draft(grammar, draft: list[int]) -> list[int]:
    """The longest prefix of a chain draft that grammar accepts; the matcher is left as it was."""
    return list(cut_tree(grammar, DraftTree.chain(draft)).tokens)


def masked_draft_rows(backend, grammar, draft: list[int], rows: torch.Tensor) -> torch.Tensor:
    """masked_tree_rows of a chain draft (one cut_draft returned)."""
    return masked_tree_rows(backend, grammar, DraftTree.chain(draft), rows)
