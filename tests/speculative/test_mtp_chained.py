"""Chained MTP heads: a DeepSeek-V3 / GLM-4.5 checkpoint with num_nextn_predict_layers 2 drafts step
k with head k (llama.cpp's chained heads): every head's KV of the context is built from the
target's hidden states, and step k's rows are the draft so far, each from the state the step before
gave. The first proposal after a prefill equals that chain computed from the heads' modules over
the HF model's hidden states (causal attention over the whole sequence, no draft machinery), and
differs from what reusing head 0 would draft; with chains and with trees the greedy tokens are
exactly speculation off's (alone, 8 at once in prefill chunks, after a cached prefix)."""

from __future__ import annotations

import pytest
import torch

from radixlm.speculative.draft_tree import CHAIN
from radixlm.speculative.eagle_head import causal_attend
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.mtp_checkpoints import LAYERS, checkpoint
from tests.speculative.test_mtp_source import POOL_TOKENS, _prompts, _run

NEXTN = 2


@pytest.fixture(scope="module")
def chained(tmp_path_factory):
    """family -> (path, hf model)."""
    out = {}
    for family in ("deepseek_v3", "glm4_moe"):
        path = str(tmp_path_factory.mktemp(f"chained-{family}"))
        out[family] = (path, checkpoint(path, family, nextn=NEXTN)[0])
    return out


def _first_proposals(path: str, prompts: list[list[int]]):
    """Each prompt alone, its first proposal (a 2-token chain) after the prefill: -> (the head,
    [(request tokens, drafted tokens)])."""
    d = Driver(
        make_scheduler(
            path,
            speculative_algorithm="nextn",
            speculative_draft_policy="fixed",
            speculative_num_steps=NEXTN,
            speculative_num_draft_tokens=NEXTN,
            speculative_eagle_topk=1,
            max_total_tokens=POOL_TOKENS,
        )
    )
    src = d.s.spec.controller.source
    propose, seen = src.propose, {}

    def recording(reqs, ks, shape=CHAIN):
        out = propose(reqs, ks, shape)
        for r, tree in zip(reqs, out):
            seen.setdefault(r.rid, (list(r.all_ids()), list(tree.tokens)))
        return out

    src.propose = recording
    for p in prompts:
        rid = d.submit(p, max_new_tokens=4, temperature=0, ignore_eos=True)
        d.run()
        assert rid in seen
    return src.head, list(seen.values())


def _reference(hf, head, tokens: list[int], step_heads: tuple[int, ...]) -> list[int]:
    """The chain drafted after `tokens` (prompt + its first output) with step k on head
    step_heads[k]: rows t read token t + 1 and the target's state at t; each step appends a row of
    its draft token and the state the step before gave."""
    prompt = torch.tensor(tokens[:-1])
    with torch.no_grad():
        feats = hf.model(prompt[None]).last_hidden_state[0]  # after the final norm
        emb = hf.model.embed_tokens(torch.tensor(tokens[1:]))
    out = []
    with torch.inference_mode():
        for h in step_heads:
            y, nxt = head(emb, feats, torch.arange(len(emb)), causal_attend(), True, head=h)
            token = int(hf.lm_head(y[-1]).argmax())
            out.append(token)
            emb = torch.cat((emb, hf.model.embed_tokens(torch.tensor([token]))))
            feats = torch.cat((feats, nxt[-1:]))
    return out


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_step_k_drafts_with_head_k(chained, family):
    path, hf = chained[family]
    prompts = _prompts([7, 19, 33], seed=11)
    head, proposals = _first_proposals(path, prompts)
    assert head.num_chained == NEXTN and head.cfg.layer_index == LAYERS
    reused = 0
    for tokens, drafted in proposals:
        assert drafted == _reference(hf, head, tokens, (0, 1)), tokens
        reused += drafted != _reference(hf, head, tokens, (0, 0))
    assert reused > 0  # head 1 drafts what head 0 would not: the test tells them apart


# DeepSeek's latent attention drafts the chain above; its exact outputs cost ~75 s: `-m extended`
EXTENDED = pytest.mark.extended(reason="the same chained drafting as GLM's, over MLA")


@pytest.mark.parametrize(
    "family", [pytest.param("deepseek_v3", marks=EXTENDED), pytest.param("glm4_moe")]
)
def test_chained_heads_keep_greedy_outputs_exact(chained, family):
    """Chains and trees (topk 3: a level's paths rerun under its head)."""
    path = chained[family][0]
    long = _prompts([90], seed=3)[0]
    batch = _prompts([3, 11, 25, 7, 40, 17, 5], seed=4) + [long]
    rounds = [
        [(_prompts([9], seed=2)[0], 12)],
        [(p, 5 + 2 * i) for i, p in enumerate(batch)],
        [(long[:40] + _prompts([6], seed=5)[0], 10)],
    ]
    plain, _, _ = _run(path, rounds)
    for topk in (1, 3):
        spec, cached, st = _run(
            path,
            rounds,
            speculative_algorithm="nextn",
            speculative_draft_policy="fixed",
            speculative_eagle_topk=topk,
            speculative_num_steps=NEXTN,
        )
        assert spec == plain, topk
        assert cached[-1] == 40
        assert st["spec_verify_steps"] > 20 and st["spec_draft_tokens"] > 50, st
