"""The EAGLE draft source: every draft it proposes while requests run (catching its head's KV up
after prefills, chunks, rejected and accepted drafts, in batches) equals the head's greedy chain
computed from scratch over the whole sequence with HF's hidden states of the target; and through
the engine, greedy outputs stay those of plain decoding (mixed batches, chunked prefill, stops,
penalties, grammars, streams, aborts), with the KV invariants checked after every step."""

import json
import threading

import jsonschema
import pytest
import torch
from transformers import AutoConfig, LlamaForCausalLM

from radixlm import Engine
from radixlm.speculative.draft_tree import CHAIN, ROOT
from radixlm.speculative.eagle_checkpoint import load_eagle_head, load_token_map
from radixlm.speculative.eagle_head import causal_attend
from radixlm.speculative.eagle_prompts import default_prompts
from tests.conftest import engine_args
from tests.engine.workloads import run, workload
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.conftest import random_head_dir

NEAR_TIE = 1e-3
EAGLE3_AUX = [-1, 0, 0]  # of a 2-layer target: the embedding, then twice the stream after layer 0


@pytest.fixture(scope="module")
def eagle3_head_dir(tmp_path_factory, hot_model_dir):
    cfg = AutoConfig.from_pretrained(hot_model_dir)
    return random_head_dir(
        tmp_path_factory.mktemp("eagle3"),
        cfg,
        "eagle3",
        draft_vocab_size=256,
        aux_layer_ids=EAGLE3_AUX,
    )


def reference_logits(head, vocab_logits, embed, tokens, feats, path):
    """The head's logits after `tokens` and then the draft tokens `path`, from scratch: rows (token
    t + 1, target features at t) for every position, then each path token with the head's own state
    of the row before it, causal attention over all of them."""
    ids, pos, own = list(tokens[1:]) + list(path), list(range(len(tokens) - 1 + len(path))), []
    with torch.no_grad():
        for j in range(
            len(path) + 1
        ):  # row by row along the path: each reads the state of the one before
            n = len(tokens) - 1 + j
            emb = embed(torch.tensor(ids[:n])).float()
            if head.cfg.kind == "eagle":
                rows = torch.cat([feats] + ([torch.stack(own)] if own else []))
                out, nxt = head(emb, rows, torch.tensor(pos[:n]), causal_attend(), from_target=True)
            else:  # EAGLE-3: target rows through fc, the head's own states as they are
                x = torch.cat([head.fc(feats)] + ([torch.stack(own)] if own else []))
                nxt = head.midlayer(x, emb, torch.tensor(pos[:n]), head.rope, causal_attend())
                out = head.norm(nxt)
            own.append(nxt[-1])
    return vocab_logits(out[-1:])[0]


def target_features(hf, tokens, kind, capture_layers):
    with torch.no_grad():
        hs = hf(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    if kind == "eagle":
        return hs[-1][0]  # after the final norm
    return torch.cat(
        [hs[i][0] for i in capture_layers], dim=-1
    )  # hs[i]: the stream entering layer i


def check_tree(tree, logits_after, to_target, label):
    """Every node's children (and the root's) are the head's top tokens after that node's path, best
    first (a divergence only at a near-tie of the reference's logits)."""
    for node in [ROOT] + list(range(len(tree))):
        kids = tree.children(node)
        if not kids:
            continue
        path = [] if node == ROOT else tree.path_tokens(tree.ancestors(node))
        logits = logits_after(path)
        top = torch.topk(logits, len(kids) + 1)
        want = to_target(top.indices[: len(kids)]).tolist()
        got = [tree.tokens[k] for k in kids]
        for r, (a, b) in enumerate(zip(got, want)):
            if a != b:
                gap = float(top.values[r] - top.values[r + 1])
                assert gap < NEAR_TIE, (
                    f"{label}: after {path} the head ranks {want}, the tree has {got} (gap"
                    f" {gap:.3g})"
                )
                break


@pytest.mark.parametrize("kind,topk", [("eagle", 1), ("eagle", 3), ("eagle3", 1), ("eagle3", 3)])
def test_drafts_equal_the_heads_own_ranking_from_scratch(
    kind, topk, hot_model_dir, trained_head_dir, eagle3_head_dir
):
    """Chains (topk 1) and trees: each proposed node's children are the head's top tokens after that
    node's path, computed from scratch over the whole sequence with HF's hidden states of the
    target.
    """
    head_dir = trained_head_dir if kind == "eagle" else eagle3_head_dir
    # No radix cache: a cached prefix would bring head KV that another request's next token wrote.
    opts = dict(
        speculative_algorithm=kind,
        speculative_draft_model_path=head_dir,
        speculative_draft_policy="fixed",
        speculative_num_steps=3,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=6,
        chunked_prefill_size=16,
        max_running_requests=4,
        disable_radix_cache=True,
    )
    if kind == "eagle":
        opts["speculative_token_map"] = f"{trained_head_dir}/token_map.pt"
    d = Driver(make_scheduler(hot_model_dir, **opts))
    source = d.s.spec.controller.source
    seen = []
    propose = source.propose

    def recording(reqs, ks, shape=CHAIN):
        out = propose(reqs, ks, shape)
        seen.extend((list(r.all_ids()), o) for r, k, o in zip(reqs, ks, out) if k and len(o))
        return out

    source.propose = recording
    tok = d.s.tokenizer.get()
    for p in default_prompts(3, seed=5):  # chat prompts, as the head was trained on (other ones)
        ids = tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
        )
        d.submit(ids, max_new_tokens=24, temperature=0, ignore_eos=True)
    while not d.idle():
        d.step()
    stats = d.s.spec.info()
    assert stats["spec_verify_steps"] > 10
    if kind == "eagle":  # the trained head: accepted drafts make multi-row catch-ups
        assert stats["spec_accepted_tokens"] > 10
    if topk > 1:
        assert any(not t.is_chain for _, t in seen)

    head = load_eagle_head(head_dir, kind, source.head.cfg.vocab_size, 64)
    if kind == "eagle":
        ids = load_token_map(f"{trained_head_dir}/token_map.pt", head.cfg.vocab_size)
        rows = torch.nn.functional.embedding(
            ids, source.embed.weight.detach()
        ).float()  # tied: the LM head's rows
        vocab_logits, to_target = (lambda h: h @ rows.T), (lambda c: ids[c])
    else:
        vocab_logits, to_target = head.lm_head, (lambda c: head.draft_token_ids()[c])
    hf = LlamaForCausalLM.from_pretrained(hot_model_dir, dtype=torch.float32).eval()
    for n, (tokens, tree) in enumerate(
        seen[::2]
    ):  # every other proposal: enough, and half the time
        feats = target_features(hf, tokens, kind, head.cfg.capture_layers(2))
        check_tree(
            tree,
            lambda path: reference_logits(head, vocab_logits, source.embed, tokens, feats, path),
            to_target,
            f"proposal {n} after {len(tokens)} tokens",
        )
    assert len(seen) > 10


GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
SCHEMA = {
    "type": "object",
    "properties": {"a": {"enum": ["red", "green", "blue"]}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
}
LOOPY = [[5 + (i % 7) for i in range(40)], list(range(1000, 1030))]


def engine_outputs(model_dir, full: bool = True, **spec):
    """The mixed workload (chunked prefill, stops, penalties, a second wave; unless not `full`), a
    JSON-schema request beside free ones, a stream, and two aborted requests; -> the outputs (and
    the engine's state)."""
    constrained = {"max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    with Engine(
        model_dir, **engine_args(chunked_prefill_size=16, max_running_requests=8, **spec)
    ) as e:
        prompts, sps = workload(e) if full else ([], [])
        mixed = e.generate(
            input_ids=LOOPY + [[7, 8, 9, 10]], sampling_params=[GREEDY, GREEDY, constrained]
        )
        assert mixed[2]["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(mixed[2]["text"]), SCHEMA)
        stream = list(e.generate(input_ids=LOOPY[1], sampling_params=GREEDY, stream=True))
        t = threading.Thread(
            target=lambda: e.generate(
                input_ids=[LOOPY[0]] * 2,
                rid=["x1", "x2"],
                sampling_params={**GREEDY, "max_new_tokens": 200},
            )
        )
        t.start()
        e.abort_request("x1")
        e.abort_request("x2")
        t.join()
        outs = (
            run(e, prompts, sps) if full else None,
            [o["output_ids"] for o in mixed],
            stream[-1]["output_ids"],
        )
        st = e.get_internal_state()
        assert st["num_running"] == 0 and st["req_slots_free"] == st["req_slots_total"]
        return outs, st


@pytest.fixture(scope="module")
def plain_outputs(hot_model_dir):
    pytest.importorskip("xgrammar")
    return engine_outputs(hot_model_dir)[0]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_engine_greedy_outputs_equal_plain_decoding(
    kind, hot_model_dir, trained_head_dir, eagle3_head_dir, plain_outputs
):
    """Default tree shapes (top-4, 5 levels). The EAGLE-3 head (random) skips the mixed workload:
    the
    scheduler paths it covers are the trained EAGLE head's here and every source's elsewhere."""
    head_dir = trained_head_dir if kind == "eagle" else eagle3_head_dir
    outs, st = engine_outputs(
        hot_model_dir,
        full=kind == "eagle",
        speculative_algorithm=kind,
        speculative_draft_model_path=head_dir,
        speculative_draft_policy="fixed",
    )
    assert st["spec_verify_steps"] > 0
    if kind == "eagle":  # the trained head
        assert st["spec_accepted_tokens"] > 0 and st["spec_tree_drafts"] > 0
        assert outs == plain_outputs
    else:
        assert outs[1:] == plain_outputs[1:]


def test_a_cached_prefix_brings_the_heads_kv_but_not_where_requests_part(
    hot_model_dir, trained_head_dir, monkeypatch
):
    """B shares A's prompt up to a point, from the radix tree: B's first proposal reads the head's
    KV A wrote for the shared positions, except the last, which A computed with its own next
    token."""
    from radixlm.speculative import eagle_attention

    seen = []
    add = eagle_attention.ProposalAttention.add_request

    def recording(self, prefix_slots, tokens, catch_up, max_nodes):
        r = add(self, prefix_slots, tokens, catch_up, max_nodes)
        seen.append((tokens.tolist(), r.prefix, r.prefix_valid.tolist()))
        return r

    monkeypatch.setattr(eagle_attention.ProposalAttention, "add_request", recording)
    d = Driver(
        make_scheduler(
            hot_model_dir,
            speculative_algorithm="eagle",
            speculative_draft_model_path=trained_head_dir,
            speculative_draft_policy="fixed",
            speculative_eagle_topk=1,
        )
    )
    shared = [1000 + j for j in range(40)]
    d.submit(shared + [7, 8, 9], max_new_tokens=6, temperature=0, ignore_eos=True)
    while not d.idle():
        d.step()
    n = len(seen)
    d.submit(shared + [5, 6], max_new_tokens=6, temperature=0, ignore_eos=True)
    while not d.idle():
        d.step()
    tokens, prefix, valid = seen[n]  # B's first proposal
    assert (
        tokens[:42] == shared + [5, 6] and prefix == 40
    )  # the tree gave B the 40 shared positions
    assert valid == [True] * 39 + [False]  # position 39 read A's 7, not B's 5: left out
    # B never computes position 39 (its target features came from A's prefill): left out for good;
    # every other entry of its later proposals is valid.
    assert len(seen) > n + 2 and all(
        v[:39] + v[40:] == [True] * (len(v) - 1) and not v[39] for _, _, v in seen[n + 1 :]
    )
