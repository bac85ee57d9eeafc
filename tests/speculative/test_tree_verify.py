"""Verification of draft trees: greedy acceptance is the longest path of the target's argmax (then
its own token), multi-candidate rejection sampling keeps the target's distribution (a verifier-only
chi-square test, and one through the scheduler on a model with an 8-token vocabulary whose exact
sequence probabilities come from transformers), and the KV of the accepted path is what the request
keeps."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
import torch

from radixlm.sampling_params import SamplingParams
from radixlm.speculative.draft_tree import ROOT, DraftTree
from radixlm.speculative.verify import accept_tree, sample_tree, target_probs
from tests.scheduler.harness import Driver, make_scheduler

scipy_stats = pytest.importorskip("scipy.stats")
ALPHA = 0.001


def random_tree(rng: random.Random, n: int, vocab: int) -> DraftTree:
    """Siblings carry distinct tokens (as every source's trees do)."""
    tokens, parents = [], []
    for _i in range(n):
        p = rng.choice([ROOT] + list(range(len(tokens))))
        free = sorted(set(range(vocab)) - {t for t, q in zip(tokens, parents) if q == p})
        if free:
            tokens.append(rng.choice(free))
            parents.append(p)
    return DraftTree(tuple(tokens), tuple(parents))


def test_greedy_acceptance_is_the_longest_argmax_path():
    """Against a naive walk: every path of the tree, the longest one whose every token is the
    target's argmax after the path before it; then the argmax after it."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    for _ in range(300):
        vocab = rng.randrange(2, 5)  # few tokens: paths often match
        tree = random_tree(rng, rng.randrange(0, 9), vocab)
        rows = torch.randn(len(tree) + 1, vocab, generator=gen)
        best: list[int] = []
        for node in range(len(tree)):
            path = tree.ancestors(node)
            if all(
                tree.tokens[n] == int(rows[0 if j == 0 else path[j - 1] + 1].argmax())
                for j, n in enumerate(path)
            ):
                if len(path) > len(best):
                    best = path
        acc = accept_tree(rows, tree, SamplingParams(temperature=0))
        assert acc.path == best
        assert acc.tokens == tree.path_tokens(best) + [
            int(rows[best[-1] + 1 if best else 0].argmax())
        ]


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4)]
)
def test_multi_candidate_rejection_keeps_the_target_distribution(params):
    """A root with three children (one of them twice: its copy is never accepted) and a grandchild:
    the first emitted token follows the root's distribution, the second (after child 0 is
    accepted) child 0's row, each a chi-square goodness of fit at 0.001; every branch is taken."""
    vocab, draws = 6, 12000
    logits = torch.tensor(
        [
            [1.5, 1.0, 0.5, 0.0, -0.5, 1.2],  # root
            [0.0, 1.5, 0.2, 1.0, -1.0, 0.3],  # after child 0 (token 0)
            [0.3, 0.0, 0.0, 0.0, 0.5, 0.0],  # after child 1 (token 5)
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # after child 2 (token 0 again)
            [1.0, 0.0, 0.0, 2.0, 0.5, -2.0],
        ]
    )  # after grandchild (token 3 under child 0)
    tree = DraftTree((0, 5, 0, 3), (ROOT, ROOT, ROOT, 0))
    p = target_probs(logits, params)
    gen = torch.Generator().manual_seed(7)
    first, second, paths = torch.zeros(vocab), torch.zeros(vocab), Counter()
    assert accept_tree(logits, tree, params, gen).tokens[0] in range(vocab)  # the whole call, once
    for _ in range(draws):  # the walk over the distributions accept_tree computes
        acc = sample_tree(p, tree, gen)
        first[acc.tokens[0]] += 1
        paths[tuple(acc.path)] += 1
        assert 2 not in acc.path, "a duplicate of a rejected child is never accepted"
        if acc.path[:1] == [0]:
            second[acc.tokens[1]] += 1
    for counts, probs in ((first, p[0]), (second, p[1])):
        keep = probs > 0
        assert counts[~keep].sum() == 0, "a token outside the distribution's support"
        assert scipy_stats.chisquare(counts[keep], probs[keep] * counts.sum()).pvalue > ALPHA
    assert {(), (0,), (0, 3), (1,)} <= set(paths), paths


# --- through the scheduler: an 8-token vocabulary ------------------------------------------------

PROMPT = [1, 2, 3]
NEW = 3  # tokens per draw: 8 ** 3 sequences, their exact probabilities computed below


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    """A random 2-layer Llama with 8 tokens (peaked enough that draws repeat: the radix tree then
    holds several recorded continuations of each context), saved for the engine; and the exact
    probability of every 3-token continuation at temperature 0.8 (float64 transformers)."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        initializer_range=0.5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("vocab8")
    hf.save_pretrained(path)
    seqs = torch.tensor([PROMPT + [a, b] for a in range(8) for b in range(8)])
    with torch.no_grad():
        logp = torch.log_softmax(hf.double()(seqs).logits / 0.8, dim=-1)  # [64, 5, 8]
    exact = {}
    for i, (a, b) in enumerate(itertools.product(range(8), range(8))):
        for c in range(8):
            exact[(a, b, c)] = float(torch.exp(logp[i, 2, a] + logp[i, 3, b] + logp[i, 4, c]))
    return str(path), exact


def test_tree_verification_samples_the_target_distribution(small_vocab_model):
    """2000 draws of 3 tokens (temperature 0.8) with radix drafts: each new draw's tree holds the
    earlier draws' continuations of its first token (up to 4 branches per node), verified by
    multi-candidate rejection sampling. The sequences' frequencies fit the exact distribution
    (chi-square goodness of fit at 0.001, sequences expected fewer than 5 times pooled); trees
    branched and non-first children were accepted; the KV invariants hold after every step."""
    path, exact = small_vocab_model
    d = Driver(
        make_scheduler(
            path,
            speculative_algorithm="radix",
            speculative_draft_policy="fixed",
            speculative_num_draft_tokens=8,
            max_running_requests=64,
            max_total_tokens=4096,
            max_prefill_tokens=100000,
        )
    )
    draws = 2000
    rids = [
        d.submit(PROMPT, max_new_tokens=NEW, temperature=0.8, ignore_eos=True) for _ in range(draws)
    ]
    while not d.idle():
        d.step()
    st = d.s.spec.info()
    assert st["spec_tree_drafts"] > 0 and st["spec_branch_accepted"] > 0, st
    counts = Counter(tuple(d.results[r].output_ids) for r in rids)
    assert sum(counts.values()) == draws and all(len(k) == NEW for k in counts)
    big = [k for k, p in exact.items() if p * draws >= 5]
    observed = [counts[k] for k in big] + [draws - sum(counts[k] for k in big)]
    expected = [exact[k] * draws for k in big] + [draws * (1 - sum(exact[k] for k in big))]
    assert len(big) >= 10, "too few likely sequences for the test to say anything"
    assert scipy_stats.chisquare(observed, expected).pvalue > ALPHA, (observed, expected)


def test_sources_hear_the_kept_nodes_and_their_forward_rows(small_vocab_model):
    """DraftSource.on_verified (the EAGLE half's socket): per drafted request and verify step, the
    accepted nodes and the verify forward's rows of the root and of each of them: the rows hold
    exactly those tokens in the step's input_ids, and the request's output grew by their tokens."""
    path, _ = small_vocab_model
    d = Driver(
        make_scheduler(
            path,
            speculative_algorithm="radix",
            speculative_draft_policy="fixed",
            max_running_requests=16,
            max_total_tokens=2048,
        )
    )
    source, runner = d.s.spec.controller.source, d.s.runner
    inputs, heard = {}, []
    prepare = runner.prepare

    def recording_prepare(mwb):
        inputs["ids"], inputs["mode"] = list(mwb.input_ids), mwb.forward_mode
        return prepare(mwb)

    def on_verified(req, tree, accepted, rows):
        assert inputs["mode"].is_verify()
        ids = inputs["ids"]
        assert len(rows) == len(accepted) + 1
        assert [ids[r] for r in rows[1:]] == tree.path_tokens(accepted)
        assert [
            r - rows[0] - 1 for r in rows[1:]
        ] == accepted  # node j sits at the root's row + 1 + j
        assert tree.ancestors(accepted[-1]) == accepted if accepted else True
        heard.append((req.rid, len(req.output_ids), tree.path_tokens(accepted), ids[rows[0]]))

    runner.prepare, source.on_verified = recording_prepare, on_verified
    _ = [
        d.submit(PROMPT, max_new_tokens=6, temperature=t, ignore_eos=True) for t in (0.0, 1.0) * 40
    ]
    while not d.idle():
        d.step()
    assert heard and any(tokens for _, _, tokens, _ in heard)
    for rid, n_out, tokens, root in heard:  # the output as it stood when the source heard:
        out = PROMPT + d.results[rid].output_ids  # ..., the root, the kept tokens, the target's own
        at = len(PROMPT) + n_out - len(tokens) - 2
        assert out[at] == root and out[at + 1 : at + 1 + len(tokens)] == tokens
