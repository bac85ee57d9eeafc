"""Draft sources against naive references, and the verifier's acceptance rules: greedy equals the
argmax chain, rejection sampling leaves every emitted token distributed as the target's
distribution (chi-square tests at significance 0.001)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.sampling_params import SamplingParams
from radixlm.speculative.ngram import NgramDraftSource
from radixlm.speculative.verify import accept_draft, target_probs

chi2 = pytest.importorskip("scipy.stats").chi2
ALPHA = 0.001


def naive_lookup(ids, k, min_n, max_n):
    """Longest suffix (max_n down to min_n) with an earlier occurrence; what followed its latest
    one."""
    n_tok = len(ids)
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = ids[n_tok - n :]
        for end in range(n_tok - 1, n - 1, -1):
            if ids[end - n : end] == suffix:
                return ids[end : end + k]
    return []


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 8), min_size=1, max_size=12),
    k=st.integers(1, 6),
    windows=st.tuples(st.integers(1, 4), st.integers(0, 4)),
)
def test_ngram_matches_a_naive_scan_as_tokens_arrive(tokens, cuts, k, windows):
    min_n, max_n = windows[0], windows[0] + windows[1]
    src = NgramDraftSource(min_n, max_n)
    n = 0
    for c in cuts + [len(tokens)]:  # the request's tokens grow between calls
        n = min(len(tokens), n + c)
        assert src.lookup("r", tokens[:n], k) == naive_lookup(tokens[:n], k, min_n, max_n)
    src.forget("r")
    assert not src._indexes


def test_ngram_examples():
    src = NgramDraftSource(2, 4)
    assert src.lookup("a", [1, 2, 3, 4, 9, 1, 2], 3) == [3, 4, 9]
    assert src.lookup("b", [5, 6, 7], 3) == []  # no earlier occurrence
    assert src.lookup("c", [1, 2, 1, 2, 1, 2], 2) == [1, 2]  # the latest occurrence
    with pytest.raises(ValueError, match="window"):
        NgramDraftSource(3, 2)


def test_greedy_acceptance_is_the_argmax_chain():
    gen = torch.Generator().manual_seed(0)
    greedy, rng = SamplingParams(temperature=0), random.Random(0)
    for _ in range(300):
        k = rng.randrange(0, 5)
        rows = torch.randn(k + 1, 7, generator=gen)
        target = rows.argmax(-1).tolist()
        draft = [t if rng.random() < 0.7 else (t + 1) % 7 for t in target[:k]]
        a = next((j for j in range(k) if draft[j] != target[j]), k)
        assert accept_draft(torch.log_softmax(rows, -1), draft, greedy) == draft[:a] + [target[a]]


def _chi2_ok(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """Goodness of fit of counts to probs (categories of zero probability must stay empty)."""
    zero = probs == 0
    assert counts[zero].sum() == 0, "a token outside the distribution's support was emitted"
    n = counts.sum()
    expected = probs[~zero] * n
    stat = float(((counts[~zero] - expected) ** 2 / expected).sum())
    return stat < chi2.ppf(1 - ALPHA, int((~zero).sum()) - 1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=4),
    ],
)
def test_rejection_sampling_keeps_the_target_distribution(params):
    vocab, draws = 6, 12000
    logits = torch.tensor(
        [
            [2.0, 1.0, 0.5, 0.0, -0.5, -1.0],  # after the context
            [0.0, 1.5, 0.2, 1.0, -1.0, 0.3],  # after the context + draft[0]
            [1.0, 0.0, 0.0, 2.0, 0.5, -2.0],
        ]
    )  # after the context + draft[:2]
    rows = torch.log_softmax(logits, -1)
    draft = [1, 3]  # a likely-enough first draft, so both positions get many samples
    p = target_probs(rows, params)
    gen = torch.Generator().manual_seed(1234)
    first = torch.zeros(vocab)
    second = torch.zeros(vocab)  # the token after an accepted draft[0]
    for _ in range(draws):
        out = accept_draft(rows, draft, params, gen)
        first[out[0]] += 1
        if out[0] == draft[0]:
            assert len(out) >= 2
            second[out[1]] += 1
    assert _chi2_ok(first, p[0])
    assert _chi2_ok(second, p[1])
    # The rejection branch must actually run: the first draft is accepted only about p0(d) of the
    # time.
    assert 0 < first[draft[0]] < draws
