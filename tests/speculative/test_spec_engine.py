"""Speculative decoding through the engine: greedy outputs token for token those of plain
decoding (tiny random models of each architecture, batching, chunked prefill, stops, penalties,
logprobs, grammars, aborts, streaming), with the KV ownership invariants checked after every step
(engine_args turns them on) and drafts actually verified and accepted."""

import threading

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args, flush_when_idle
from tests.engine.workloads import LOOPY, loop_options, run

GREEDY = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}


def engines(plain, radix):
    """The plain engine and the radix-drafting one (tests/conftest.py), by
    speculative_algorithm."""
    return {None: plain, "radix": radix}


@pytest.fixture(scope="module")
def arch_dir(request, tiny_model_dir, tmp_path_factory, default_model_path):
    if request.param == "llama":
        return tiny_model_dir
    import transformers

    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.25,
    )
    if request.param == "qwen2":
        cfg, cls = (
            transformers.Qwen2Config(**common, tie_word_embeddings=True),
            transformers.Qwen2ForCausalLM,
        )
    else:
        cfg, cls = (
            transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=False),
            transformers.Qwen3ForCausalLM,
        )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    cls(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


# Unchunked prefill on llama only: the scheduler path does not depend on the architecture.
@pytest.mark.parametrize(
    "arch_dir,chunk",
    [("llama", -1), ("llama", 16), ("qwen2", 16), ("qwen3", 16)],
    indirect=["arch_dir"],
)
@pytest.mark.parametrize("algorithm", ["ngram", "radix"])
def test_greedy_outputs_equal_plain_decoding(arch_dir, chunk, algorithm, plain_loop):
    """The mixed workload twice (the second pass finds the first's outputs in the radix tree) and
    echo prompts, with and without speculation (plain decoding's answers: one plain engine per model
    and chunk size, tests/engine/workloads.py). (Random tiny models seldom repeat themselves, so
    prompt lookup seldom drafts here: its drafts are exercised by the default model below and by
    tests/scheduler/test_randomized.py's noisy drafts.)"""
    ref = plain_loop(arch_dir, chunk)
    (prompts, sps), (echo, echo_outs) = ref["work"], ref["echo"]
    # radix asserts that its drafts were verified: the fixed policy drafts whatever it finds (the
    # adaptive one decides from step times measured as it runs, and on a loaded machine may rightly
    # draft nothing).
    policy = "fixed" if algorithm == "radix" else "adaptive"
    options = dict(speculative_algorithm=algorithm, speculative_draft_policy=policy)
    with Engine(arch_dir, **loop_options(chunk, **options)) as e:
        outs = e.generate(input_ids=echo, sampling_params=[GREEDY] * len(echo))
        got = (run(e, prompts, sps), run(e, prompts, sps), [o["output_ids"] for o in outs])
        state = e.get_internal_state()
    assert got == (ref["runs"][0], ref["runs"][1], echo_outs)
    if algorithm == "radix":  # repeated requests: the earlier greedy answers are the drafts
        assert state["spec_verify_steps"] > 0 and state["spec_accepted_tokens"] > 0


DEFAULT_MODEL_PROMPTS = [
    (
        "Fruits: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon,"
        " mango.\nFruits again: apple, banana,"
    ),
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
    "Once upon a time",
]
DEFAULT_MODEL_SP = {"max_new_tokens": 32, "temperature": 0}


def default_model_outputs(e) -> list:
    """The prompts twice (the second time cached)."""
    sps = [DEFAULT_MODEL_SP] * len(DEFAULT_MODEL_PROMPTS)
    return [[o["output_ids"] for o in e.generate(DEFAULT_MODEL_PROMPTS, sps)] for _ in range(2)]


@pytest.mark.parametrize("algorithm", ["ngram", "radix"])
def test_default_model_greedy_equal(default_model_path, algorithm, default_engine):
    """The default model (GGUF weights on the native kernels) copies text it has seen: prompt
    lookup drafts the copy, and a verify step's rows give exactly the decode steps' tokens (plain
    decoding: tests/speculative/conftest.py's engine)."""
    options = engine_args(speculative_algorithm=algorithm, num_threads=2)
    with Engine(default_model_path, **options) as e:
        got, st = default_model_outputs(e), e.get_internal_state()
    assert st["spec_verify_steps"] > 0 and st["spec_accepted_tokens"] > 0
    assert got == default_model_outputs(default_engine)


def test_logprobs_and_meta_info(tiny_engine, radix_engine):
    """The second identical request verifies the first's answer (radix drafts): its logprobs are
    those of plain decoding, in fewer forwards."""
    outs = {}
    for spec, e in engines(tiny_engine, radix_engine).items():
        for _ in range(2):
            outs[spec] = e.generate(
                input_ids=LOOPY[0],
                sampling_params=GREEDY,
                return_logprob=True,
                top_logprobs_num=3,
                logprob_start_len=30,
            )
    a, b = outs[None], outs["radix"]
    assert a["output_ids"] == b["output_ids"]
    ma, mb = a["meta_info"], b["meta_info"]
    for key in ("output_token_logprobs", "input_token_logprobs"):
        assert len(ma[key]) == len(mb[key])
        for x, y in zip(ma[key], mb[key]):
            assert x[1] == y[1] and (x[0] is None) == (y[0] is None)
            if x[0] is not None:
                assert x[0] == pytest.approx(y[0], abs=1e-4)
    assert len(ma["output_top_logprobs"]) == len(mb["output_top_logprobs"]) == len(a["output_ids"])
    for xs, ys in zip(ma["output_top_logprobs"], mb["output_top_logprobs"]):
        assert [e[1] for e in xs] == [e[1] for e in ys]
        assert [e[0] for e in xs] == pytest.approx([e[0] for e in ys], abs=1e-4)
    assert mb["spec_verify_ct"] > 0 and mb["spec_accepted_tokens"] > 0
    assert ma["spec_verify_ct"] == 0
    # Fewer forwards than tokens: accepted drafts came for free.
    assert mb["forward_passes"] < ma["forward_passes"]


def test_a_cached_prompt_starts_in_its_first_verify_step(tiny_engine, radix_engine):
    """A prompt cached but for its last token (the same call again, or an earlier answer's start)
    gets no prefill step of its own: that token is the root of its first verify step, which carries
    the recorded answer (prefill_fold.py). Tokens and logprobs are plain decoding's; a request whose
    last token has no recorded continuation starts in a plain decode step; one that wants prompt
    logprobs still gets its extend step. A one-token prompt has nothing cached and one token to
    compute: its first step is a decode step at position 0."""
    first = LOOPY[2]
    outs, extends = {}, []
    for spec, e in engines(tiny_engine, radix_engine).items():
        answer = e.generate(input_ids=first, sampling_params=GREEDY)["output_ids"]
        prompts = [first, first + answer[:7], first[:-1] + [first[-1] + 1], first, first[:1]]
        outs[spec] = []
        for i, p in enumerate(prompts):
            before = e.get_internal_state()["extend_steps"]
            extra = {"logprob_start_len": 5} if i == 3 else {}
            outs[spec].append(
                e.generate(input_ids=p, sampling_params=GREEDY, return_logprob=True, **extra)
            )
            extends.append((spec, e.get_internal_state()["extend_steps"] - before))
    assert len(outs[None]) == len(outs["radix"]) == 5
    for a, b in zip(outs[None], outs["radix"]):
        assert a["output_ids"] == b["output_ids"]
        for key in ("output_token_logprobs", "input_token_logprobs"):
            xs, ys = a["meta_info"][key], b["meta_info"][key]
            assert [x[1] for x in xs] == [y[1] for y in ys]
            assert [x[0] for x in xs] == pytest.approx([y[0] for y in ys], abs=1e-4)
    assert extends == [(None, 1)] * 5 + [("radix", 0)] * 3 + [("radix", 1), ("radix", 0)]
    m_same, m_start, m_new, m_lp, _ = [o["meta_info"] for o in outs["radix"]]
    assert m_same["cached_tokens"] == len(first) - 1
    assert (
        m_same["forward_passes"] == m_same["spec_verify_ct"] == 1
    )  # the whole answer in one forward
    assert m_start["spec_accepted_tokens"] >= len(answer) - 8  # the rest of the recorded answer
    assert (
        m_new["forward_passes"] > m_new["spec_verify_ct"]
    )  # nothing recorded follows its last token
    assert m_lp["spec_accepted_tokens"] > 0 and m_lp["forward_passes"] == m_lp["spec_verify_ct"] + 1


def test_a_folded_request_aborted_before_its_first_step(tiny_model_dir):
    """A folded request waits RUNNING, its last prompt token uncomputed, while an extend step runs
    for a request beside it (prefill_fold.py). Aborted then, it finishes once as aborted with no
    token, and every KV slot and request slot comes back (invariants after every step, an idle
    check at the end); the requests beside it answer as plain decoding does."""
    from radixlm.scheduler.req import ReqStatus
    from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler

    fresh = [7, 8, 9, 10, 11, 12]
    outs = {}
    for spec in (None, "radix"):
        d = Driver(
            make_scheduler(
                tiny_model_dir,
                speculative_algorithm=spec,
                speculative_draft_policy="fixed",
                max_total_tokens=1024,  # the invariant checks walk the pool every step
            )
        )
        d.submit(LOOPY[2], rid="first", **GREEDY)
        d.run()
        d.submit(LOOPY[2], rid="folded", **GREEDY)
        d.submit(fresh, rid="fresh", **GREEDY)
        d.submit(LOOPY[2], rid="kept", **GREEDY)
        # the extend step computes "fresh"; with radix "folded" and "kept" only joined the running
        # batch
        d.step()
        if spec:
            req = d.find("folded")
            assert req.status is ReqStatus.RUNNING and d.results["folded"].output_ids == []
            d.abort("folded")
        d.run()
        assert_idle_memory_ok(d.s)
        outs[spec] = d.results
    r = outs["radix"]
    assert r["folded"].finishes == 1 and r["folded"].finish_reason["type"] == "abort"
    assert r["folded"].output_ids == []
    for rid in ("first", "fresh", "kept"):
        assert r[rid].output_ids == outs[None][rid].output_ids and r[rid].finishes == 1
    assert r["kept"].output_ids == r["first"].output_ids


def test_stop_strings_inside_an_accepted_draft(tiny_engine, radix_engine):
    """A stop token, stop string or length limit that lands inside a verified chain ends the
    output there (radix drafts: the same prompt's full answer is in the tree)."""
    ref = tiny_engine.generate(input_ids=LOOPY[1], sampling_params=GREEDY)["output_ids"]
    text = tiny_engine.tokenizer.decode(ref[20:22])
    flush_when_idle(tiny_engine)  # below, as a fresh engine: the first call fills the cache
    cases = [
        {"stop_token_ids": [ref[25]]},
        {"stop": [text]},
        {"max_new_tokens": 23},
        {"stop": [text], "no_stop_trim": True},
    ]
    res = {}
    for spec, e in engines(tiny_engine, radix_engine).items():
        e.generate(input_ids=LOOPY[1], sampling_params=GREEDY)
        res[spec] = [e.generate(input_ids=LOOPY[1], sampling_params={**GREEDY, **c}) for c in cases]
        if spec:
            assert all(o["meta_info"]["spec_accepted_tokens"] > 0 for o in res[spec]), [
                o["meta_info"] for o in res[spec]
            ]
    for a, b in zip(res[None], res["radix"]):
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
    assert len(res[None][0]["output_ids"]) < 40


def test_grammar_requests_run_beside_drafted_ones(tiny_engine, radix_engine):
    pytest.importorskip("xgrammar")
    regex = {"max_new_tokens": 12, "temperature": 0, "regex": "(ab|cd){2,5}"}
    res = {}
    for spec, e in engines(tiny_engine, radix_engine).items():
        accepted = e.get_internal_state()["spec_accepted_tokens"] if spec else 0
        for _ in range(2):  # the second pass drafts the free requests' first answers
            outs = e.generate(
                input_ids=[LOOPY[0], [7, 8, 9, 10], LOOPY[2]],
                sampling_params=[GREEDY, regex, GREEDY],
            )
        res[spec] = [(o["output_ids"], o["text"]) for o in outs]
        if spec:  # drafts accepted by this test's requests
            assert e.get_internal_state()["spec_accepted_tokens"] > accepted
    assert res["radix"] == res[None]


def test_abort_and_stream_with_drafts(tiny_engine, radix_engine):
    """Aborted requests release everything (invariants after every step), the rest are unchanged;
    a stream carries the same tokens as the whole answer."""
    sp = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}
    ref = tiny_engine.generate(input_ids=LOOPY[2], sampling_params=GREEDY)["output_ids"]
    e = radix_engine
    e.generate(input_ids=[LOOPY[0], LOOPY[2]], sampling_params=[sp, GREEDY])
    t = threading.Thread(
        target=lambda: e.generate(
            input_ids=[LOOPY[0]] * 3, sampling_params=sp, rid=["x1", "x2", "x3"]
        )
    )
    t.start()
    pieces = list(e.generate(input_ids=LOOPY[2], sampling_params=GREEDY, stream=True))
    e.abort_request("x2")
    e.abort_request("x1")
    t.join()
    assert pieces[-1]["output_ids"] == ref
    assert pieces[-1]["meta_info"]["spec_accepted_tokens"] > 0
    st = e.get_internal_state()
    assert st["num_running"] == 0 and st["req_slots_free"] == st["req_slots_total"]
    assert st["available_kv_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"]


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory):
    """The tiny Llama's shape (conftest.py's tiny_model_dir) over the tiny BPE tokenizer, ~900
    tokens rather than SmolLM2's 49k: verifying a sampled draft tree walks the vocabulary per
    request and node, most of the sampling test's time at 49k; the rejection sampler's path is the
    same at any vocabulary size."""
    import transformers

    from tests.model.hybrid_checkpoints import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=tok.eos_token_id,
        initializer_range=0.25,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama-small-vocab")
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("algorithm", ["radix"])
def test_sampling_distribution_unchanged(small_vocab_dir, algorithm):
    """Many draws of 3 tokens at one fixed context (temperature 1, top-k 4: few outcomes, so drafts
    from earlier draws often match): the joint frequencies of the 3 tokens (verify steps emit them
    all: the cached prompt's last token is a verify step's root, prefill_fold.py) with speculation
    match plain sampling's (two-sample chi-square, significance 0.001; outcomes seen fewer than 10
    times pooled).
    Fixed draft policy: at this batch size the adaptive one would rightly draft little, and this
    test is about the verifier."""
    check_sampling_distribution(small_vocab_dir, algorithm, LOOPY[0])


def check_sampling_distribution(model_dir, algorithm, prompt, n=1536, temperature=1.0):
    """test_sampling_distribution_unchanged's check, for any model and draft source (the MTP
    heads': test_mtp_fit.py, test_mtp_hybrid.py). The pool holds 64 requests of the prompt (shared)
    and 3 tokens each: 8k tokens, not the default 1 GB (an MTP head's own KV pool is allocated at
    its size). temperature: where a model's logits are so far apart that temperature 1 is greedy."""
    from collections import Counter

    from tests.scheduler.harness import Driver, make_scheduler

    chi2_contingency = pytest.importorskip("scipy.stats").chi2_contingency
    sp = {"max_new_tokens": 3, "temperature": temperature, "top_k": 4, "ignore_eos": True}
    draws = {}
    for spec in (None, algorithm):
        d = Driver(
            make_scheduler(
                model_dir,
                speculative_algorithm=spec,
                max_running_requests=64,
                max_total_tokens=8192,
                enable_invariant_checks=False,
                speculative_draft_policy="fixed",
            )
        )
        rids = [d.submit(prompt, **sp) for _ in range(n)]
        while not d.idle():
            d.step()
        draws[spec] = Counter(tuple(d.results[r].output_ids) for r in rids)
        if spec:
            st = d.s.spec.info()
            assert (
                st["spec_verify_steps"] > 0
                and 0 < st["spec_accepted_tokens"] < st["spec_draft_tokens"]
            )
    seen = draws[None] + draws[algorithm]
    common = [k for k, c in seen.items() if c >= 10]
    table = [
        [d[k] for k in common] + [sum(c for k, c in d.items() if k not in common)]
        for d in draws.values()
    ]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    assert len(table[0]) >= 3, "too few distinct outcomes for the test to say anything"
    assert chi2_contingency(table).pvalue > 0.001, table
