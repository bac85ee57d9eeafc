"""The extra samplers (typical_p, bad_words, allowed_token_ids, DRY, XTC) in the batched sampler,
against naive per-row references (llama.cpp's and vLLM's definitions written out plainly) and HF's
warpers, in seeded batches that mix them with every other filter and with rows that use none."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from radixlm.model.layers.dry import dry_penalties
from radixlm.model.layers.sampler import (
    Sampler,
    SamplingBatchInfo,
    SamplingRow,
    apply_penalties,
    sampling_probs,
)
from radixlm.sampling_params import SamplerTokens, SamplingParams
from tests.sampler_refs import ref_bad_word_bans, ref_dry

V = 50


# ----------------------------------------------------------------- naive references
def ref_xtc(probs_row, threshold):
    """llama.cpp's XTC on one row: sort descending, drop every token before the last one >=
    threshold."""
    p = probs_row / probs_row.sum()
    order = sorted(range(len(p)), key=lambda t: -float(p[t]))
    above = [t for t in order if p[t] >= threshold and p[t] > 0]
    out = probs_row.clone()
    if len(above) >= 2:
        out[above[:-1]] = 0.0
    return out


def ref_row(logits_row, sp, out, prompt, gen):
    """One row's final distribution, filter after filter (None for a greedy row: its argmax)."""
    x = logits_row.clone()
    t = sp.resolved_tokens
    if sp.allowed_token_ids is not None:
        keep = torch.zeros(V, dtype=torch.bool)
        keep[sp.allowed_token_ids] = True
        x[~keep] = -math.inf
    if sp.bad_words:
        for b in ref_bad_word_bans(t.bad_words, out):
            x[b] = -math.inf
    if sp.dry_active:
        for tok, pen in ref_dry(list(prompt) + list(out), sp, t.dry_single, t.dry_multi).items():
            x[tok] -= pen
    if sp.is_greedy:
        return x, None
    s = TemperatureLogitsWarper(sp.temperature)(None, x.unsqueeze(0))
    if sp.top_k != -1:
        s = TopKLogitsWarper(sp.top_k)(None, s)
    if sp.top_p < 1:
        s = TopPLogitsWarper(sp.top_p)(None, s)
    if sp.min_p > 0:
        s = MinPLogitsWarper(sp.min_p)(None, s)
    if sp.typical_p < 1:
        s = TypicalLogitsWarper(sp.typical_p)(None, s)
    probs = torch.softmax(s[0], dim=-1)
    if sp.xtc_active and float(torch.rand((), generator=gen)) <= sp.xtc_probability:
        probs = ref_xtc(probs, sp.xtc_threshold)
    return x, probs / probs.sum()


# ----------------------------------------------------------------- a random mixed batch
def random_row(rng: random.Random):
    kw = dict(
        temperature=rng.choice([0.0, 0.7, 1.0, 1.3]),
        top_k=rng.choice([-1, -1, 1, 5, 20]),
        top_p=rng.choice([1.0, 1.0, 0.8]),
        min_p=rng.choice([0.0, 0.0, 0.05]),
        typical_p=rng.choice([1.0, 1.0, 0.5, 0.9]),
        xtc_probability=rng.choice([0.0, 0.0, 0.5, 1.0]),
        xtc_threshold=rng.choice([0.0, 0.02, 0.05, 0.1, 0.2]),
    )
    words, single, multi = (), frozenset(), None
    if rng.random() < 0.4:
        words = tuple(
            tuple(rng.randrange(6) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 3))
        )
        kw["bad_words"] = ["(resolved below)"]
    if rng.random() < 0.3:
        kw["allowed_token_ids"] = rng.sample(range(V), rng.randint(12, 30))
    if rng.random() < 0.5:
        kw.update(
            dry_multiplier=rng.choice([0.8, 2.0]),
            dry_base=rng.choice([1.75, 1.1, 3.0]),
            dry_allowed_length=rng.choice([1, 2, 3]),
            dry_penalty_last_n=rng.choice([-1, 8, 30]),
        )
        single = frozenset(rng.sample(range(6), rng.randint(0, 1)))
        multi = {rng.randrange(6): ((rng.randrange(6),),)} if rng.random() < 0.5 else None
    sp = SamplingParams(**kw)
    sp.verify(V)
    sp.resolved_tokens = SamplerTokens(bad_words=words, dry_single=single, dry_multi=multi)
    # a small alphabet, so that contexts repeat themselves
    prompt = [rng.randrange(6) for _ in range(rng.randint(1, 25))]
    out = [rng.randrange(6) for _ in range(rng.randint(0, 25))]
    return sp, prompt, out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_mixed_batches_match_the_per_row_references(seed):
    rng = random.Random(seed)
    bs = rng.randint(1, 8)
    rows = [random_row(rng) for _ in range(bs)]
    logits = torch.randn(bs, V, generator=torch.Generator().manual_seed(seed)) * 2.5
    seeds = [rng.randrange(2**31) for _ in range(bs)]
    srows = [
        SamplingRow(sp, out, prompt, torch.Generator().manual_seed(s), [])
        for (sp, prompt, out), s in zip(rows, seeds)
    ]
    info = SamplingBatchInfo.build(srows, V, torch.device("cpu"))
    penalized = apply_penalties(logits, info)
    probs = sampling_probs(penalized, info)
    for i, (sp, prompt, out) in enumerate(rows):
        ref_logits, ref_probs = ref_row(
            logits[i], sp, out, prompt, torch.Generator().manual_seed(seeds[i])
        )
        torch.testing.assert_close(penalized[i], ref_logits, msg=f"row {i}: {sp}")
        if ref_probs is None:
            continue
        ours = probs[i] / probs[i].sum()
        assert torch.equal(ours > 0, ref_probs > 0), f"row {i}: kept tokens differ: {sp}"
        torch.testing.assert_close(ours, ref_probs, atol=1e-5, rtol=1e-4)
    # The sampler draws inside each row's reference support; greedy rows take the reference argmax.
    ids = Sampler()(
        logits,
        SamplingBatchInfo.build(
            [
                SamplingRow(sp, out, prompt, torch.Generator().manual_seed(s), [])
                for (sp, prompt, out), s in zip(rows, seeds)
            ],
            V,
            torch.device("cpu"),
        ),
    )
    for i, (sp, prompt, out) in enumerate(rows):
        ref_logits, ref_probs = ref_row(
            logits[i], sp, out, prompt, torch.Generator().manual_seed(seeds[i])
        )
        if ref_probs is None:
            assert int(ids[i]) == int(ref_logits.argmax())
        else:
            assert ref_probs[int(ids[i])] > 0


def test_rows_without_extras_build_none_of_them():
    """The default path: no extras object, no vocab mask, nothing per token."""
    rows = [
        SamplingRow(SamplingParams(temperature=0.7, top_p=0.9), [1, 2], [3]),
        SamplingRow(SamplingParams()),
    ]
    info = SamplingBatchInfo.build(rows, V, torch.device("cpu"))
    assert info.extras is None and info.vocab_mask is None


# ----------------------------------------------------------------- DRY
contexts = st.lists(st.integers(0, 4), min_size=0, max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    context=contexts,
    multiplier=st.sampled_from([0.5, 1.0, 3.0]),
    base=st.sampled_from([1.0, 1.2, 1.75, 40.0]),
    allowed=st.integers(1, 4),
    last_n=st.sampled_from([-1, 1, 5, 17, 100]),
    single=st.frozensets(st.integers(0, 4), max_size=2),
    multi=st.dictionaries(
        st.integers(0, 4),
        st.lists(
            st.tuples(st.integers(0, 4)) | st.tuples(st.integers(0, 4), st.integers(0, 4)),
            min_size=1,
            max_size=2,
        ).map(tuple),
        max_size=2,
    ),
)
def test_dry_penalties_match_llama_cpps_definition(
    context, multiplier, base, allowed, last_n, single, multi
):
    sp = SamplingParams(
        dry_multiplier=multiplier,
        dry_base=base,
        dry_allowed_length=allowed,
        dry_penalty_last_n=last_n,
    )
    ours = dry_penalties(context, sp, single, multi)
    ref = ref_dry(context, sp, single, multi)
    assert ours.keys() == ref.keys()
    for k in ref:
        assert ours[k] == pytest.approx(ref[k], rel=1e-9)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    context=st.lists(st.integers(0, 2), min_size=4, max_size=40),
    allowed=st.integers(1, 3),
    multi=st.dictionaries(
        st.integers(0, 2),
        st.lists(
            st.lists(st.integers(0, 2), min_size=1, max_size=3).map(tuple), min_size=1, max_size=2
        ).map(tuple),
        min_size=1,
        max_size=2,
    ),
)
def test_dry_multi_token_breakers_cap_repeats_at_the_breakers_end(context, allowed, multi):
    """Breakers of several tokens (a head and its tail) on a three-token alphabet: repeats are
    capped at the tokens after the whole breaker, as llama.cpp's restart sequences."""
    sp = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=allowed)
    assert dry_penalties(context, sp, frozenset(), multi) == pytest.approx(
        ref_dry(context, sp, frozenset(), multi)
    )


@pytest.mark.parametrize("n", [70, 300, 1000])
def test_dry_on_long_degenerate_repeats(n):
    """A context repeating itself for longer than the candidate passes (the Z-algorithm path)."""
    rng = random.Random(n)
    unit = [rng.randrange(50) for _ in range(7)]
    context = (unit * (n // 7 + 1))[:n] + [rng.randrange(50) for _ in range(3)] + unit[:5]
    sp = SamplingParams(dry_multiplier=0.8, dry_base=1.01, dry_allowed_length=2)
    ref = ref_dry(context, sp)
    assert ref and dry_penalties(context, sp) == pytest.approx(ref)
    same = [9] * n  # one token over and over: the next 9 would extend a repeat of n - 1 tokens
    assert (
        dry_penalties(same, sp)
        == pytest.approx(ref_dry(same, sp))
        == {9: pytest.approx(0.8 * 1.01 ** (n - 1 - 2))}
    )


# ----------------------------------------------------------------- typical_p, XTC, bans
@pytest.mark.parametrize("mass", [0.2, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_typical_p_keeps_hfs_tokens(mass, temperature):
    torch.manual_seed(int(mass * 100) + int(temperature * 10))
    logits = torch.randn(6, V) * 3
    params = [SamplingParams(temperature=temperature, typical_p=mass)] * 3 + [
        SamplingParams(temperature=temperature)
    ] * 3
    info = SamplingBatchInfo.build([SamplingRow(p) for p in params], V, torch.device("cpu"))
    kept = sampling_probs(apply_penalties(logits, info), info) > 0
    for i in range(3):
        hf = TypicalLogitsWarper(mass)(
            None, TemperatureLogitsWarper(temperature)(None, logits[i : i + 1].clone())
        )
        assert torch.equal(kept[i], torch.isfinite(hf[0]))
    assert kept[3:].all()  # rows without typical_p keep everything


def test_xtc_coin_comes_from_the_rows_seeded_generator():
    """xtc_probability 0.5: the filter applies on the steps whose coin (the row's own generator)
    falls under it; a seeded request repeats its choices, whatever shares its batch."""
    torch.manual_seed(5)
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0] + [-5.0] * (V - 4)])
    sp = SamplingParams(xtc_probability=0.5, xtc_threshold=0.1)
    applied = []
    gen, ref_gen = torch.Generator().manual_seed(77), torch.Generator().manual_seed(77)
    for _ in range(40):
        info = SamplingBatchInfo.build([SamplingRow(sp, generator=gen)], V, torch.device("cpu"))
        probs = sampling_probs(logits, info)[0]
        applied.append(bool(probs[0] == 0))
        coin = float(torch.rand((), generator=ref_gen))
        assert applied[-1] == (coin <= 0.5)
    assert 0 < sum(applied) < 40


def test_allowed_token_ids_and_bad_words_hold_for_greedy_and_sampled_rows():
    torch.manual_seed(6)
    logits = torch.randn(4, V)
    top = logits.argmax(-1)
    allowed = [t for t in range(V) if t != int(top[0])][:10]
    a = SamplingParams(temperature=0, allowed_token_ids=allowed)
    b = SamplingParams(temperature=0, bad_words=["w"])
    b.resolved_tokens = SamplerTokens(bad_words=((7, int(top[1])),))
    c = SamplingParams(temperature=1.0, allowed_token_ids=[3, 4])
    rows = [
        SamplingRow(a),
        SamplingRow(b, output_ids=[1, 7]),
        SamplingRow(c),
        SamplingRow(b, output_ids=[1, 8]),
    ]
    ids = Sampler()(logits, SamplingBatchInfo.build(rows, V, torch.device("cpu")))
    assert int(ids[0]) == max(allowed, key=lambda t: float(logits[0, t]))
    assert int(ids[1]) == int(
        logits[1].topk(2).indices[1]
    )  # the word's last token is banned after its first
    assert int(ids[2]) in (3, 4)
    assert int(ids[3]) == int(top[3])  # another prefix: nothing banned
