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
from radixlm.speculative.eagle_checkpoint import load_eagle_head, load_token_map
from radixlm.speculative.eagle_head import causal_attend
from radixlm.speculative.eagle_prompts import default_prompts
from tests.conftest import engine_args
from tests.engine.test_overlap import run, workload
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.conftest import random_head_dir

NEAR_TIE = 1e-3
EAGLE3_AUX = [-1, 0, 0]  # of a 2-layer target: the embedding, then twice the stream after layer 0


@pytest.fixture(scope="module")
def eagle3_head_dir(tmp_path_factory, hot_model_dir):
    cfg = AutoConfig.from_pretrained(hot_model_dir)
    return random_head_dir(tmp_path_factory.mktemp("eagle3"), cfg, "eagle3", draft_vocab_size=256,
                           aux_layer_ids=EAGLE3_AUX)


def reference_chain(head, vocab_logits, to_target, embed, tokens, feats, depth):
    """The head's greedy chain after `tokens`, from scratch: rows (token t + 1, target features at t)
    for every position, then its own drafts, causal attention over all of them. -> (chain, top-2
    gaps of each step's logits)."""
    ids, pos = list(tokens[1:]), list(range(len(tokens) - 1))
    xs = None
    chain, gaps = [], []
    with torch.no_grad():
        for _ in range(depth):
            emb = embed(torch.tensor(ids)).float()
            if head.cfg.kind == "eagle":
                rows = torch.cat([feats] + ([torch.stack(xs)] if xs else []))
                out, nxt = head(emb, rows, torch.tensor(pos), causal_attend(), from_target=True)
            else:  # EAGLE-3: target rows through fc, the head's own states as they are
                x = torch.cat([head.fc(feats)] + ([torch.stack(xs)] if xs else []))
                nxt = head.midlayer(x, emb, torch.tensor(pos), head.rope, causal_attend())
                out = head.norm(nxt)
            logits = vocab_logits(out[-1:])[0]
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            tok = int(to_target(top.indices[:1])[0])
            chain.append(tok)
            xs = (xs or []) + [nxt[-1]]
            ids.append(tok)
            pos.append(pos[-1] + 1)
    return chain, gaps


def target_features(hf, tokens, kind, capture_layers):
    with torch.no_grad():
        hs = hf(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    if kind == "eagle":
        return hs[-1][0]  # after the final norm
    return torch.cat([hs[i][0] for i in capture_layers], dim=-1)  # hs[i]: the stream entering layer i


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_drafts_equal_the_heads_chain_from_scratch(kind, hot_model_dir, trained_head_dir, eagle3_head_dir):
    head_dir = trained_head_dir if kind == "eagle" else eagle3_head_dir
    # No radix cache: a cached prefix would bring head KV that another request's next token wrote.
    opts = dict(speculative_algorithm=kind, speculative_draft_model_path=head_dir, speculative_draft_policy="fixed",
                speculative_num_steps=4, chunked_prefill_size=16, max_running_requests=4, disable_radix_cache=True)
    if kind == "eagle":
        opts["speculative_token_map"] = f"{trained_head_dir}/token_map.pt"
    d = Driver(make_scheduler(hot_model_dir, **opts))
    source = d.s.spec.controller.source
    seen = []
    propose = source.propose

    def recording(reqs, ks, shape=None):
        out = propose(reqs, ks, shape)
        seen.extend((list(r.all_ids()), k, o) for r, k, o in zip(reqs, ks, out) if k)
        return out

    source.propose = recording
    tok = d.s.tokenizer.get()
    for p in default_prompts(3, seed=5):  # chat prompts, as the head was trained on (other ones)
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True))
        d.submit(ids, max_new_tokens=30, temperature=0, ignore_eos=True)
    while not d.idle():
        d.step()
    stats = d.s.spec.info()
    assert stats["spec_verify_steps"] > 10
    if kind == "eagle":  # the trained head: accepted drafts make multi-row catch-ups
        assert stats["spec_accepted_tokens"] > 10

    head = load_eagle_head(head_dir, kind, source.head.cfg.vocab_size, 64)
    if kind == "eagle":
        ids = load_token_map(f"{trained_head_dir}/token_map.pt", head.cfg.vocab_size)
        hf_head = torch.nn.functional.embedding(ids, source.embed.weight.detach()).float()  # tied: the head's rows
        vocab_logits, to_target = (lambda h: h @ hf_head.T), (lambda c: ids[c])
    else:
        vocab_logits, to_target = head.lm_head, (lambda c: head.draft_token_ids()[c])
    hf = LlamaForCausalLM.from_pretrained(hot_model_dir, dtype=torch.float32).eval()
    checked = 0
    for tokens, k, draft in seen:
        feats = target_features(hf, tokens, kind, head.cfg.capture_layers(2))
        chain, gaps = reference_chain(head, vocab_logits, to_target, source.embed, tokens, feats, min(k, 4))
        for j, (a, b) in enumerate(zip(draft, chain)):
            if a != b:
                assert gaps[j] < NEAR_TIE, f"draft {draft} vs reference {chain} at {j} (gap {gaps[j]:.3g}), {len(tokens)} tokens"
                break
        else:
            assert len(draft) == len(chain)
        checked += 1
    assert checked == len(seen) > 10


GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
SCHEMA = {"type": "object", "properties": {"a": {"enum": ["red", "green", "blue"]}, "b": {"type": "boolean"}},
          "required": ["a", "b"]}
LOOPY = [[5 + (i % 7) for i in range(40)], list(range(1000, 1030))]


def engine_outputs(model_dir, **spec):
    """The mixed workload (chunked prefill, stops, penalties, a second wave), a JSON-schema request
    beside free ones, a stream, and two aborted requests; -> the outputs (and the engine's state)."""
    constrained = {"max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    with Engine(model_dir, **engine_args(chunked_prefill_size=16, max_running_requests=8, **spec)) as e:
        prompts, sps = workload(e)
        mixed = e.generate(input_ids=LOOPY + [[7, 8, 9, 10]], sampling_params=[GREEDY, GREEDY, constrained])
        assert mixed[2]["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(mixed[2]["text"]), SCHEMA)
        stream = list(e.generate(input_ids=LOOPY[1], sampling_params=GREEDY, stream=True))
        t = threading.Thread(target=lambda: e.generate(input_ids=[LOOPY[0]] * 2, rid=["x1", "x2"],
                                                       sampling_params={**GREEDY, "max_new_tokens": 200}))
        t.start()
        e.abort_request("x1")
        e.abort_request("x2")
        t.join()
        outs = (run(e, prompts, sps), [o["output_ids"] for o in mixed], stream[-1]["output_ids"])
        st = e.get_internal_state()
        assert st["num_running"] == 0 and st["req_slots_free"] == st["req_slots_total"]
        return outs, st


@pytest.fixture(scope="module")
def plain_outputs(hot_model_dir):
    pytest.importorskip("xgrammar")
    return engine_outputs(hot_model_dir)[0]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_engine_greedy_outputs_equal_plain_decoding(kind, hot_model_dir, trained_head_dir, eagle3_head_dir,
                                                    plain_outputs):
    head_dir = trained_head_dir if kind == "eagle" else eagle3_head_dir
    outs, st = engine_outputs(hot_model_dir, speculative_algorithm=kind, speculative_draft_model_path=head_dir,
                              speculative_draft_policy="fixed")
    assert st["spec_verify_steps"] > 0
    if kind == "eagle":  # the trained head
        assert st["spec_accepted_tokens"] > 0
    assert outs == plain_outputs
