"""Prompt-lookup drafts: the longest suffix of the request's tokens that occurred earlier in its
own prompt or output proposes what followed that occurrence (its most recent one).

Per request, an index maps every n-gram (min_n <= n <= max_n) to the ends of its latest
occurrences (MAX_OCCURRENCES of them); it grows with the tokens appended since the last call, so a
step costs O(new tokens x window sizes), not a scan of the whole context.

A chain draft is what followed the latest occurrence. A tree draft (lookup_tree, when the step's
shape allows branches) is the trie of what followed each of the kept occurrences, best first by
how many occurrences continue the same way (the latest first on a tie): the top continuations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.speculative.draft_source import PerRequestDraftSource
from radixlm.speculative.draft_tree import CHAIN, DraftTree, TreeShape, trie_children

MAX_OCCURRENCES = 8  # latest occurrences kept per n-gram (a tree's candidate continuations)


@dataclass
class _Index:
    # n-gram -> ends (exclusive) of its latest occurrences, oldest first
    ends: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending at positions < indexed are in `ends`


class NgramDraftSource(PerRequestDraftSource):
    def __init__(self, min_n: int = 2, max_n: int = 8):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram match window sizes need 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._indexes: dict[str, _Index] = {}

    def draft_for(self, req, k: int, shape: TreeShape = CHAIN):
        if shape.width > 1:
            return self.lookup_tree(req.rid, req.all_ids(), k, shape)[0]
        return self.lookup(req.rid, req.all_ids(), k)

    def lookup(self, rid: str, token_ids: list[int], k: int) -> list[int]:
        return self.lookup_with_match(rid, token_ids, k)[0]

    def lookup_with_match(self, rid: str, token_ids: list[int], k: int) -> tuple[list[int], int]:
        """lookup's draft and the length of the suffix it matched (0: none)."""
        ends, n = self._match(rid, token_ids, k)
        return (token_ids[ends[-1] : ends[-1] + k], n) if n else ([], 0)

    def lookup_tree(
        self, rid: str, token_ids: list[int], k: int, shape: TreeShape
    ) -> tuple[DraftTree, int]:
        """A tree of at most k nodes within shape from what followed the latest occurrences of the
        longest matching suffix, and that suffix's length (0: none)."""
        ends, n = self._match(rid, token_ids, k)
        if not n:
            return DraftTree.empty(), 0
        depth = min(k, shape.depth)
        root, children = trie_children([(token_ids[e : e + depth], 1.0) for e in reversed(ends)])
        return DraftTree.grow(root, children, k, shape), n

    def _match(self, rid: str, token_ids: list[int], k: int) -> tuple[list[int], int]:
        """The ends of the latest occurrences of the longest suffix of token_ids that occurred
        before, and its length (0: none)."""
        n_tok = len(token_ids)
        if k <= 0 or n_tok <= self.min_n:
            return [], 0
        idx = self._indexes.get(rid)
        if idx is None or idx.indexed > n_tok:  # new, or the tokens were rewritten (jump-forward)
            idx = self._indexes[rid] = _Index()
        # Index every n-gram that ends before the last token: the suffix itself must match an
        # earlier occurrence, which then has at least one token after it.
        ends = idx.ends
        for end in range(max(idx.indexed, self.min_n), n_tok):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                occ = ends.setdefault(tuple(token_ids[end - n : end]), [])
                occ.append(end)
                if len(occ) > MAX_OCCURRENCES:
                    del occ[0]
        idx.indexed = max(idx.indexed, n_tok)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            occ = ends.get(tuple(token_ids[n_tok - n :]))
            if occ is not None:
                return occ, n
        return [], 0

    def release(self, req) -> None:
        self.forget(req.rid)

    def forget(self, rid: str) -> None:
        self._indexes.pop(rid, None)
