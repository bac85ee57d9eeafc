"""The batched sampler against HF transformers' logits processors and against the distribution."""

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from radixlm.model.layers.sampler import (
    Sampler,
    SamplingBatchInfo,
    SamplingRow,
    apply_penalties,
    top_k_top_p_min_p,
)
from radixlm.sampling_params import SamplingParams

V = 50


def info_for(params, outputs=None, prompts=None, gens=None, banned=None):
    n = len(params)
    outputs, prompts = outputs or [[] for _ in range(n)], prompts or [[] for _ in range(n)]
    gens, banned = gens or [None] * n, banned or [[] for _ in range(n)]
    rows = [
        SamplingRow(p, o, q, g, b)
        for p, o, q, g, b in zip(params, outputs, prompts, gens, banned, strict=True)
    ]
    return SamplingBatchInfo.build(rows, V, torch.device("cpu"))


def hf_support(logits_row, sp: SamplingParams):
    x = logits_row.unsqueeze(0).clone()
    x = TemperatureLogitsWarper(sp.temperature)(None, x)
    if sp.top_k != -1:
        x = TopKLogitsWarper(sp.top_k)(None, x)
    if sp.top_p < 1:
        x = TopPLogitsWarper(sp.top_p)(None, x)
    if sp.min_p > 0:
        x = MinPLogitsWarper(sp.min_p)(None, x)
    return torch.isfinite(x[0])


@pytest.mark.parametrize(
    "kw",
    [
        dict(top_k=5),
        dict(top_p=0.7),
        dict(min_p=0.2),
        dict(top_k=10, top_p=0.5),
        dict(top_p=0.9, min_p=0.05),
    ],
)
def test_filters_keep_the_same_tokens_as_hf(kw):
    torch.manual_seed(0)
    params = [SamplingParams(temperature=0.8, **kw) for _ in range(4)]
    logits = torch.randn(4, V) * 3
    info = info_for(params)
    probs = torch.softmax(logits / info.temperatures, dim=-1)
    kept = top_k_top_p_min_p(probs, info) > 0
    for i in range(4):
        assert torch.equal(kept[i], hf_support(logits[i], params[i])), kw


def test_repetition_penalty_matches_hf():
    torch.manual_seed(1)
    logits = torch.randn(2, V)
    prompts, outputs = [[1, 2, 3], [7]], [[3, 4, 4], [8, 9]]
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=0.8)]
    ours = apply_penalties(logits, info_for(params, outputs, prompts))
    for i in range(2):
        ids = torch.tensor([prompts[i] + outputs[i]])
        ref = RepetitionPenaltyLogitsProcessor(params[i].repetition_penalty)(
            ids, logits[i : i + 1].clone()
        )
        torch.testing.assert_close(ours[i], ref[0])


def test_frequency_and_presence_penalties_follow_openai_formula():
    logits = torch.zeros(1, V)
    out = apply_penalties(
        logits,
        info_for([SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)], [[4, 4, 4, 9]]),
    )
    assert out[0, 4].item() == pytest.approx(-(0.5 * 3 + 0.25))
    assert out[0, 9].item() == pytest.approx(-(0.5 + 0.25))
    assert out[0, 0].item() == 0.0


def test_greedy_rows_take_argmax_and_banned_tokens_never_appear():
    torch.manual_seed(2)
    logits = torch.randn(3, V)
    best = logits.argmax(-1)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(top_k=1, temperature=1.0),
        SamplingParams(temperature=0),
    ]
    ids = Sampler()(logits, info_for(params, banned=[[], [], [int(best[2])]]))
    assert ids[0] == best[0] and ids[1] == best[1]
    assert ids[2] != best[2] and ids[2] == logits[2].topk(2).indices[1]


def test_sampling_frequencies_follow_the_distribution():
    torch.manual_seed(3)
    logits = torch.randn(1, V)
    sp = SamplingParams(temperature=0.7, top_p=0.8)
    info = info_for([sp] * 4000)
    probs = top_k_top_p_min_p(torch.softmax(logits / 0.7, dim=-1), info_for([sp]))[0]
    probs = probs / probs.sum()
    ids = Sampler()(logits.expand(4000, V).contiguous(), info)
    freq = torch.bincount(ids, minlength=V).float() / 4000
    assert (freq[probs == 0] == 0).all(), "sampled a token that top_p removed"
    assert (freq - probs).abs().max() < 0.03


def test_seed_makes_a_row_independent_of_its_batch():
    torch.manual_seed(4)
    logits = torch.randn(3, V)
    sp = SamplingParams(temperature=1.0, seed=1234)

    def run(batch_logits, seeded_row):
        gens = [None] * batch_logits.shape[0]
        gens[seeded_row] = torch.Generator().manual_seed(1234)
        params = [SamplingParams(temperature=1.0)] * batch_logits.shape[0]
        params[seeded_row] = sp
        return [
            int(Sampler()(batch_logits, info_for(params, gens=gens))[seeded_row]) for _ in range(1)
        ]

    alone = [run(logits[0:1], 0)[0] for _ in range(5)]
    batched = [run(torch.cat([logits[1:3], logits[0:1]]), 2)[0] for _ in range(5)]
    assert alone == batched
    draws = []
    g = torch.Generator().manual_seed(1234)
    info = info_for([sp], gens=[g])
    for _ in range(20):
        draws.append(int(Sampler()(logits[0:1], info)[0]))
    assert len(set(draws)) > 1, "a seeded generator must advance between steps"


@pytest.mark.parametrize(
    "peaked", [True, False]
)  # nucleus inside the top-1024 candidates, or not (full sort)
def test_filters_on_a_large_vocabulary_keep_hfs_tokens(peaked):
    """On a 150k-entry vocabulary the filters sort only the candidates that can survive (top-k,
    the top 1024 when they hold the nucleus, none for min-p alone); the kept tokens stay HF's,
    row by row in a batch mixing every filter."""
    vocab = 151_936
    torch.manual_seed(1)
    kws = [
        dict(top_k=40),
        dict(top_p=0.9),
        dict(min_p=0.1),
        dict(top_k=2000, top_p=0.8),
        dict(top_p=0.95, min_p=0.02),
        dict(top_k=7, min_p=0.3),
    ]
    for batch in ([kw] for kw in kws):
        params = [SamplingParams(temperature=0.9, **kw) for kw in batch] * 2
        logits = torch.randn(len(params), vocab) * (6.0 if peaked else 0.5)
        rows = [SamplingRow(p, [], [], None, []) for p in params]
        info = SamplingBatchInfo.build(rows, vocab, torch.device("cpu"))
        probs = torch.softmax(logits / info.temperatures, dim=-1)
        kept = top_k_top_p_min_p(probs, info)
        for i, p in enumerate(params):
            assert torch.equal(kept[i] > 0, hf_support(logits[i], p)), batch
            assert torch.equal(
                kept[i][kept[i] > 0], probs[i][kept[i] > 0]
            )  # survivors keep their mass
    mixed = [SamplingParams(temperature=0.9, **kw) for kw in kws]
    logits = torch.randn(len(mixed), vocab) * (6.0 if peaked else 0.5)
    info = SamplingBatchInfo.build(
        [SamplingRow(p, [], [], None, []) for p in mixed], vocab, torch.device("cpu")
    )
    kept = top_k_top_p_min_p(torch.softmax(logits / info.temperatures, dim=-1), info) > 0
    for i, p in enumerate(mixed):
        assert torch.equal(kept[i], hf_support(logits[i], p)), p
