"""SuffixIndex: what followed a context in recent requests' outputs (the global suffix tree of
suffix decoding, bounded).

The radix tree drafts only while a request's whole token chain is cached (it repeats an earlier
prompt + answer). Answers also repeat in pieces: the same code block, JSON keys or boilerplate
after a different prompt, or after the tree evicted the earlier request. This index holds the
outputs of recently finished requests; a running request's last few tokens find the spans of
them that ended the same way, and the draft is what followed those spans.

Lookup. The longest suffix of the context, max_match tokens down to min_match, that occurs in a
held sequence with at least one token after it; its occurrences (the latest max_occurrences of
them) vote for the next token: the most frequent wins, a tie goes to the token seen most
recently. The occurrences that continue with the winner (and have a token after it) vote for
the one after, and so on up to k tokens or until none is left: a walk down a suffix trie by
counts, the trie restricted to the matched spans.

Layout. The sequences lie back to back in one list, each followed by SEP, and positions are
global (they keep counting across evictions). An occurrence of an n-gram is named by the position
of the token after it; `_last` maps every n-gram (min_match <= n <= max_match) that has a token
after it to its latest occurrence, and `_prev` chains each occurrence to the one before (the hash
chains of an LZ77 compressor), so the latest occurrences are a walk back, stopping at the first
one evicted. add() costs O(len x max_match) dict updates; propose() costs O(max_match) lookups
plus O(max_occurrences) per draft token (the cap bounds a step's work where a common phrase
occurs thousands of times, and favours recent text).

Bound. At most max_tokens tokens are held; beyond that the oldest sequences go (FIFO, the order
their requests finished). Chains need no cleanup (links only point back in time, a walk stops
below the oldest held position); an n-gram whose latest occurrence went leaves `_last`. A
sequence longer than max_tokens keeps its last max_tokens tokens. Memory per held token: up to
max_match - min_match + 1 new `_last` entries (an n-gram tuple each, about 130 bytes) and as many
8-byte links: about 1 KB per token of text or code (65536 tokens, windows 2..8: about 60 MB).
"""

from __future__ import annotations

from array import array
from collections import deque

SEP = -1  # after each held sequence: a walk stops there, token ids are never negative


class SuffixIndex:
    def __init__(
        self, max_tokens: int, min_match: int = 2, max_match: int = 8, max_occurrences: int = 256
    ):
        if not 1 <= min_match <= max_match:
            raise ValueError(
                f"suffix index match lengths need 1 <= min <= max, got {min_match}, {max_match}"
            )
        if max_tokens < 0 or max_occurrences < 1:
            raise ValueError(
                "suffix index needs max_tokens >= 0 and max_occurrences >= 1, "
                f"got {max_tokens}, {max_occurrences}"
            )
        self.max_tokens, self.min_match, self.max_match = max_tokens, min_match, max_match
        self.max_occurrences = max_occurrences
        self._windows = max_match - min_match + 1
        self.num_tokens = 0  # held tokens, SEPs not counted
        self._tokens: list[int] = []  # held sequences, each followed by SEP
        self._base = 0  # global position of _tokens[0]
        self._seqs: deque[tuple[int, int]] = (
            deque()
        )  # (start, end) of each held sequence, oldest first
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> its latest occurrence
        # _prev[(p - _base) * _windows + n - min_match]: the occurrence before the one at p of the
        # n-gram that ends before p (-1: none).
        self._prev = array("q")

    def add(self, tokens: list[int]) -> None:
        """Hold a finished request's tokens (its output, maybe after its last prompt tokens)."""
        if self.max_tokens == 0:
            return
        tokens = list(tokens[-self.max_tokens :])
        if len(tokens) <= self.min_match:
            return  # no n-gram with a token after it: nothing to propose from
        start = self._base + len(self._tokens)
        self._tokens += tokens
        self._tokens.append(SEP)
        self._prev.extend(array("q", [-1]) * ((len(tokens) + 1) * self._windows))
        self._seqs.append((start, start + len(tokens)))
        self.num_tokens += len(tokens)
        last, prev = self._last, self._prev
        for key, pos, slot in self._ngrams(tokens, start):
            prev[slot] = last.get(key, -1)
            last[key] = pos
        if self.num_tokens > self.max_tokens:
            self._evict()

    def propose(self, context: list[int], k: int) -> list[int]:
        """Up to k tokens to follow `context`, from the held sequences (module docstring)."""
        return self.propose_with_match(context, k)[0]

    def propose_with_match(self, context: list[int], k: int) -> tuple[list[int], int]:
        """propose's tokens and the length of the context suffix they follow (0: none)."""
        if k <= 0 or not self._last:
            return [], 0
        for n in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            pos = self._last.get(tuple(context[-n:]))
            if pos is not None:
                break
        else:
            return [], 0
        toks, prev, base, w = self._tokens, self._prev, self._base, self._windows
        occ = []  # the latest occurrences, newest first
        while pos >= base and len(occ) < self.max_occurrences:
            occ.append(pos)
            pos = prev[(pos - base) * w + n - self.min_match]
        out: list[int] = []
        while True:
            counts: dict[int, int] = {}
            for pos in occ:  # newest first: on a tie max() keeps the most recent token
                t = toks[pos - base]
                counts[t] = counts.get(t, 0) + 1
            best = max(counts, key=counts.__getitem__)
            out.append(best)
            if len(out) == k:
                return out, n
            occ = [
                pos + 1 for pos in occ if toks[pos - base] == best and toks[pos + 1 - base] != SEP
            ]
            if not occ:
                return out, n

    def _ngrams(self, tokens: list[int], start: int):
        """(n-gram, global position of the token after it, its `_prev` slot) for every n-gram
        of a held sequence that starts at global position `start` and has a token after it."""
        lo, w = self.min_match, self._windows
        slot = (start - self._base) * w
        for i in range(1, len(tokens)):
            pos = start + i
            slot += w
            for n in range(lo, min(self.max_match, i) + 1):
                yield tuple(tokens[i - n : i]), pos, slot + n - lo

    def _evict(self) -> None:
        gone = []
        while self.num_tokens > self.max_tokens:
            start, end = self._seqs.popleft()
            self.num_tokens -= end - start
            gone.append((start, end))
        new_base = self._seqs[0][0]  # add() truncated the newest sequence: it stays
        for start, end in gone:
            for key, _, _ in self._ngrams(
                self._tokens[start - self._base : end - self._base], start
            ):
                if self._last.get(key, new_base) < new_base:
                    del self._last[key]
        del self._tokens[: new_base - self._base]
        del self._prev[: (new_base - self._base) * self._windows]
        self._base = new_base
