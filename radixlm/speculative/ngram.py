"""Prompt-lookup drafts: the longest suffix of the request's tokens that occurred earlier in its
own prompt or output proposes what followed that occurrence (its most recent one).

Per request, an index maps every n-gram (min_n <= n <= max_n) to the end of its latest
occurrence; it grows with the tokens appended since the last call, so a step costs
O(new tokens x window sizes), not a scan of the whole context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.speculative.draft_source import PerRequestDraftSource


@dataclass
class _Index:
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> end (exclusive) of its latest occurrence
    indexed: int = 0  # n-grams ending at positions < indexed are in `ends`


class NgramDraftSource(PerRequestDraftSource):
    def __init__(self, min_n: int = 2, max_n: int = 8):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram match window sizes need 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._indexes: dict[str, _Index] = {}

    def draft_for(self, req, k: int) -> list[int]:
        return self.lookup(req.rid, req.all_ids(), k)

    def lookup(self, rid: str, token_ids: list[int], k: int) -> list[int]:
        return self.lookup_with_match(rid, token_ids, k)[0]

    def lookup_with_match(self, rid: str, token_ids: list[int], k: int) -> tuple[list[int], int]:
        """lookup's draft and the length of the suffix it matched (0: none)."""
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
                ends[tuple(token_ids[end - n : end])] = end
        idx.indexed = max(idx.indexed, n_tok)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            end = ends.get(tuple(token_ids[n_tok - n :]))
            if end is not None:
                return token_ids[end : end + k], n
        return [], 0

    def release(self, req) -> None:
        self.forget(req.rid)

    def forget(self, rid: str) -> None:
        self._indexes.pop(rid, None)
