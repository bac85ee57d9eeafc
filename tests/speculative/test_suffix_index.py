"""SuffixIndex against a naive scan of the held sequences, its token bound, and the radix source
drafting from it once a request has left the tree."""

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.radix_cache import RadixCache
from radixlm.config import ServerArgs
from radixlm.ipc import FinishAbort, FinishStop
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.req import Req
from radixlm.speculative.config import SpeculativeConfig
from radixlm.speculative.draft_tree import DraftTree
from radixlm.speculative.factory import create_draft_source
from radixlm.speculative.radix import RadixDraftSource
from radixlm.speculative.suffix_index import SuffixIndex


class NaiveSuffixIndex:
    """The held sequences as a list; every lookup scans all of them."""

    def __init__(self, max_tokens, min_n, max_n, cap):
        self.max_tokens, self.min_n, self.max_n, self.cap = max_tokens, min_n, max_n, cap
        self.seqs: list[list[int]] = []  # oldest first

    def add(self, tokens):
        if self.max_tokens == 0:
            return
        tokens = list(tokens)[-self.max_tokens :]
        if len(tokens) <= self.min_n:
            return
        self.seqs.append(tokens)
        while sum(map(len, self.seqs)) > self.max_tokens:
            self.seqs.pop(0)

    def occurrences(self, pattern):
        """(sequence, index of the token after the occurrence), oldest first."""
        n = len(pattern)
        return [(s, i) for s in self.seqs for i in range(n, len(s)) if s[i - n : i] == pattern]

    def propose(self, context, k):
        occ = []
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            occ = self.occurrences(context[-n:])
            if occ:
                break
        occ = occ[-self.cap :]
        out = []
        while occ and len(out) < k:
            counts = Counter(s[i] for s, i in occ)
            top = max(counts.values())
            best = next(
                s[i] for s, i in reversed(occ) if counts[s[i]] == top
            )  # tie: the most recent
            out.append(best)
            occ = [(s, i + 1) for s, i in occ if s[i] == best and i + 1 < len(s)]
        return out


tokens = st.lists(st.integers(0, 3), max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), tokens),
            st.tuples(st.just("propose"), tokens, st.integers(1, 6)),
        ),
        max_size=30,
    ),
    max_tokens=st.integers(0, 60),
    windows=st.tuples(st.integers(1, 3), st.integers(0, 4)),
    cap=st.sampled_from([1, 2, 3, 256]),
)
def test_suffix_index_matches_a_naive_scan(ops, max_tokens, windows, cap):
    min_n, max_n = windows[0], windows[0] + windows[1]
    idx, ref = (
        SuffixIndex(max_tokens, min_n, max_n, cap),
        NaiveSuffixIndex(max_tokens, min_n, max_n, cap),
    )
    for op in ops:
        if op[0] == "add":
            idx.add(op[1])
            ref.add(op[1])
            assert idx.num_tokens == sum(map(len, ref.seqs)) <= max_tokens
        else:
            assert idx.propose(op[1], op[2]) == ref.propose(op[1], op[2]), op
    # Whatever was evicted left no index entry behind, and the held tokens are exactly ref's.
    assert all(pos >= idx._base for pos in idx._last.values())
    assert len(idx._prev) == len(idx._tokens) * idx._windows
    assert [t for t in idx._tokens if t >= 0] == [t for s in ref.seqs for t in s]


def test_suffix_index_examples():
    idx = SuffixIndex(100, 2, 4)
    idx.add([1, 2, 3, 4, 5])
    idx.add([9, 2, 3, 7, 8])
    idx.add([6, 2, 3, 7, 0])
    # 7 follows [2, 3] twice (4 once); after it 8 and 0 tie: the later sequence's 0, then its end.
    assert idx.propose([5, 5, 2, 3], 3) == [7, 0]
    assert idx.propose([1, 2, 3], 3) == [4, 5]  # the longer match [1, 2, 3] occurs once
    assert idx.propose([4, 4], 3) == []
    assert idx.propose([2], 3) == []  # shorter than min_match
    assert idx.propose([2, 3], 0) == []
    with pytest.raises(ValueError, match="match lengths"):
        SuffixIndex(10, 3, 2)


def test_suffix_index_evicts_the_oldest_sequences():
    idx = SuffixIndex(10, 2, 3)
    idx.add([1, 2, 3, 4])
    idx.add([5, 6, 7, 8])
    assert idx.propose([1, 2], 2) == [3, 4]
    idx.add([9, 10, 11])  # 11 tokens: the first sequence goes
    assert idx.num_tokens == 7
    assert idx.propose([1, 2], 2) == []
    assert not any(1 in key for key in idx._last)
    assert idx.propose([5, 6], 2) == [7, 8]
    idx.add(list(range(20, 40)))  # longer than the bound: its last 10 tokens, nothing older
    assert idx.num_tokens == 10 and len(idx._seqs) == 1
    assert idx.propose([5, 6], 2) == [] and idx.propose([30, 31], 2) == [32, 33]
    assert idx.propose([21, 22], 2) == []  # cut off the front
    off = SuffixIndex(0, 2, 3)
    off.add([1, 2, 3, 4])
    assert off.num_tokens == 0 and off.propose([1, 2], 2) == []


def chain(draft) -> list[int]:
    """A draft that must be a chain, as its tokens."""
    tree = draft if isinstance(draft, DraftTree) else DraftTree.chain(draft)
    assert tree.is_chain, tree
    return list(tree.tokens)


def make_req(rid, prompt, output=(), finished=None):
    req = Req(rid=rid, origin_input_ids=list(prompt), sampling_params=SamplingParams(temperature=0))
    req.output_ids = list(output)
    req.finished_reason = finished
    return req


def test_radix_source_drafts_from_earlier_outputs_after_a_different_prompt():
    tree = RadixCache(TokenToKVPool(256, num_layers=1, num_kv_heads=1, head_dim=1))
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    src = RadixDraftSource(tree, SuffixIndex(1000, 2, 4))
    a = make_req("a", [1, 2, 3], answer, FinishStop(57))
    tree.insert(PrefixKey(a.all_ids()), torch.arange(len(a.all_ids())))
    src.release(a)
    # B's prompt differs: the tree has nothing after it, the suffix index has A's answer.
    b = make_req("b", [9, 9, 9], [52, 53])
    assert chain(src.draft_for(b, 3)) == [54, 55, 56]
    # A repeat of A's prompt: the tree drafts to the end of A's answer, nothing held follows it.
    c = make_req("c", [1, 2, 3], [50])
    assert chain(src.draft_for(c, 10)) == answer[1:]
    # The tree runs out (A's chain ends), the index continues from the context + the tree's part.
    tree.insert(PrefixKey([7, 7, 50, 51]), torch.arange(100, 104))
    d = make_req("d", [7, 7], [])
    assert chain(src.draft_for(d, 4)) == [50, 51, 52, 53]
    # Aborted requests are not learned from; without an index the source drafts from the tree only.
    src.release(make_req("e", [4], [60, 61, 62, 63], FinishAbort("aborted")))
    assert chain(src.draft_for(make_req("f", [8], [60, 61]), 2)) == []
    assert chain(RadixDraftSource(tree).draft_for(b, 3)) == []


def test_create_draft_source_builds_the_index_from_server_args():
    tree = RadixCache(TokenToKVPool(16, num_layers=1, num_kv_heads=1, head_dim=1))
    args = ServerArgs(
        speculative_algorithm="radix",
        speculative_suffix_index_tokens=123,
        speculative_ngram_min_match_window_size=1,
        speculative_ngram_max_match_window_size=3,
    )
    src = create_draft_source(
        SpeculativeConfig.from_server_args(args), tree, 16, ModelRunnerConfig(), 256
    )
    assert (src.suffix.max_tokens, src.suffix.min_match, src.suffix.max_match) == (123, 1, 3)
    off = ServerArgs(speculative_algorithm="radix", speculative_suffix_index_tokens=0)
    assert (
        create_draft_source(
            SpeculativeConfig.from_server_args(off), tree, 16, ModelRunnerConfig(), 256
        ).suffix
        is None
    )
    with pytest.raises(ValueError, match="suffix_index_tokens"):
        SpeculativeConfig.from_server_args(
            ServerArgs(speculative_algorithm="radix", speculative_suffix_index_tokens=-1)
        )
