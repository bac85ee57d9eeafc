"""Four scheduler failures found by review (the scheduler-hardening issue), each driven to the
exact moment it happened, in-process on the tiny model with a small KV pool:

1. a chunked request aborted while it waits for room for its next chunk corrupted the tree;
2. prompt logprobs starting past the first chunk killed the scheduler;
3. retraction ignored the waiting chunked request's KV, aborted the only running request and
   launched an empty batch;
4. with overlap, a finished request's row went to the next request while the step in flight
   still read it (its attention metadata, the decode KV mirror's key).

Each checks outputs against HF greedy / logprobs and the idle-point memory ownership."""

import random
import re
import threading

import pytest

from tests.scheduler.harness import (
    Driver,
    assert_idle_memory_ok,
    hf_greedy,
    hf_prompt_logprobs,
    make_scheduler,
)


def prompt(rng, n):
    return [rng.randrange(3, 40000) for _ in range(n)]


def test_abort_of_a_chunked_request_waiting_for_room(tiny_model_dir, tiny_hf_model):
    rng = random.Random(11)
    d = Driver(make_scheduler(tiny_model_dir, chunked_prefill_size=32, max_total_tokens=200))
    r_ids, a_ids = prompt(rng, 10), prompt(rng, 150)
    d.submit(r_ids, "R", max_new_tokens=120, temperature=0, ignore_eos=True)
    d.step()  # R prefilled: it runs, and its future tokens are reserved
    d.submit(a_ids, "A", max_new_tokens=4, temperature=0, ignore_eos=True)
    # A's chunks go in while they fit; then its next chunk does not, and R decodes instead.
    waited = False
    for _ in range(20):
        before = len(d.find("R").output_ids)
        d.step()
        chunked = d.chunked()
        if chunked is not None and chunked.rid == "A" and len(d.find("R").output_ids) > before:
            waited = True
            break
    assert waited, "A never waited between its chunks"
    d.abort("A")
    d.run()
    assert d.results["A"].finish_reason["type"] == "abort" and d.results["A"].finishes == 1
    assert_idle_memory_ok(d.s)
    # What A cached (its chunks) must be A's prompt's KV: the same prompt again gives HF's output.
    d.submit(a_ids, "C", max_new_tokens=6, temperature=0, ignore_eos=True)
    d.run()
    assert d.results["C"].cached_tokens > 0
    assert d.results["C"].output_ids == hf_greedy(tiny_hf_model, a_ids, 6)
    assert d.results["R"].output_ids == hf_greedy(tiny_hf_model, r_ids, 120)
    assert_idle_memory_ok(d.s)


@pytest.mark.parametrize("disable_radix_cache", [False, True], ids=["cache", "no-cache"])
def test_prompt_logprobs_starting_past_the_first_chunk(
    tiny_model_dir, tiny_hf_model, disable_radix_cache
):
    rng = random.Random(12)
    d = Driver(
        make_scheduler(
            tiny_model_dir, chunked_prefill_size=32, disable_radix_cache=disable_radix_cache
        )
    )
    ids = prompt(rng, 100)
    d.submit(ids[:50], "warm", max_new_tokens=1, temperature=0)  # a cached prefix (with the cache)
    d.run()
    cases = {"past-first": 80, "in-first": 5, "last-token": 99, "start": 0}
    for name, start in cases.items():
        d.submit(
            ids,
            name,
            max_new_tokens=2,
            temperature=0,
            ignore_eos=True,
            return_logprob=True,
            logprob_start_len=start,
            top_logprobs_num=2,
        )
    d.run()
    ref = hf_prompt_logprobs(tiny_hf_model, ids)
    for name, start in cases.items():
        res = d.results[name]
        assert res.finish_reason == {"type": "length", "length": 2}, name
        lps, tops = res.input_token_logprobs, res.input_top_logprobs
        assert len(lps) == len(tops) == len(ids) - start, name
        assert [t for _, t in lps] == ids[start:], name
        got = [v for v, _ in lps]
        if start == 0:
            assert got[0] is None and tops[0] is None
            got, tops, start = got[1:], tops[1:], 1
        assert got == pytest.approx(ref[start - 1 :].tolist(), abs=1e-4), name
        assert all(len(t) == 2 and t[0][0] >= v - 1e-6 for t, v in zip(tops, got)), name
        assert res.output_ids == hf_greedy(tiny_hf_model, ids, 2)
    assert_idle_memory_ok(d.s)


def test_retraction_requeues_the_chunked_request_before_aborting_anyone(
    tiny_model_dir, tiny_hf_model
):
    """The pool (200 tokens) is the context length: one running request (20 + 170 tokens) plus the
    locked chunks of a 190-token prompt do not fit. The chunked request goes back to the queue;
    both finish with HF's outputs."""
    rng = random.Random(13)
    d = Driver(make_scheduler(tiny_model_dir, chunked_prefill_size=32, max_total_tokens=200))
    assert d.s.context_len == 200
    r_ids, a_ids = prompt(rng, 20), prompt(rng, 190)
    d.submit(r_ids, "R", max_new_tokens=170, temperature=0, ignore_eos=True)
    d.step()
    d.submit(a_ids, "A", max_new_tokens=1, temperature=0, ignore_eos=True)
    d.run()
    assert d.s.stats.num_retracted >= 1
    assert d.results["R"].finish_reason == {"type": "length", "length": 170}
    assert d.results["R"].output_ids == hf_greedy(tiny_hf_model, r_ids, 170)
    assert d.results["A"].finish_reason == {"type": "length", "length": 1}
    assert d.results["A"].output_ids == hf_greedy(tiny_hf_model, a_ids, 1)
    assert_idle_memory_ok(d.s)


def test_overlap_never_hands_a_row_in_use_to_the_next_request(tiny_model_dir, tiny_hf_model):
    """A finishes on a stop token while the step after it (N+1) is already in flight. B, waiting
    for A's request slot, is admitted right then; N+1 is held on the worker until B's prefill has
    been launched, so N+1 sees whatever B's admission did to A's row. B's prompt length equals
    what N+1 leaves in the decode KV mirror's row for that slot, so B would read N+1's copy."""
    rng = random.Random(14)
    a_ids = prompt(rng, 12)
    ref_a = hf_greedy(tiny_hf_model, a_ids, 20)
    k = next(i for i in range(3, 20) if ref_a[i] not in ref_a[:i])  # A stops on its output k
    b_ids = prompt(rng, len(a_ids) + k + 1)
    d = Driver(make_scheduler(tiny_model_dir, enable_overlap_schedule=True, max_running_requests=1))
    s = d.s
    b_launched, held = threading.Event(), []
    forward, launch = s.runner.forward, s.executor.launch

    def gated_forward(fb):
        if (
            fb.forward_mode.is_decode() and int(fb.positions[0]) == len(a_ids) + k
        ):  # N+1: A's token k in
            held.append(b_launched.wait(timeout=5))
        return forward(fb)

    def noting_launch(batch):
        out = launch(batch)
        if batch.forward_mode.is_extend() and any(r.rid == "B" for r in batch.reqs):
            b_launched.set()
        return out

    s.runner.forward, s.executor.launch = gated_forward, noting_launch
    d.submit(
        a_ids, "A", max_new_tokens=30, temperature=0, ignore_eos=True, stop_token_ids=[ref_a[k]]
    )
    d.submit(b_ids, "B", max_new_tokens=8, temperature=0, ignore_eos=True)
    d.run()
    assert held == [True], "the step after A's stop token was not in flight when B was admitted"
    assert d.results["A"].output_ids == ref_a[: k + 1]
    assert d.results["B"].output_ids == hf_greedy(tiny_hf_model, b_ids, 8)
    assert_idle_memory_ok(s)
    s.executor.shutdown()


def test_a_failing_request_fails_alone(tiny_model_dir, tiny_hf_model):
    """A request whose own processing raises (its stop-string check: a tokenizer error; its
    grammar mask) finishes with an error; the others in the batch finish normally, nothing leaks."""
    rng = random.Random(15)
    d = Driver(make_scheduler(tiny_model_dir))
    ids = [prompt(rng, 9) for _ in range(4)]

    class BrokenTokenizer:
        def decode(self, *args, **kwargs):
            raise RuntimeError("tokenizer exploded")

    d.s.tokenizer.set(BrokenTokenizer())
    d.submit(ids[0], "plain", max_new_tokens=6, temperature=0, ignore_eos=True)
    d.submit(ids[1], "stop-string", max_new_tokens=6, temperature=0, ignore_eos=True, stop=["zzz"])
    d.run()
    bad = d.results["stop-string"].finish_reason
    assert (
        bad["type"] == "abort"
        and bad["status_code"] == 500
        and "tokenizer exploded" in bad["message"]
    )
    assert d.results["plain"].output_ids == hf_greedy(tiny_hf_model, ids[0], 6)
    assert_idle_memory_ok(d.s)

    d.s.tokenizer.set(None)
    d.submit(ids[2], "re-ok", max_new_tokens=6, temperature=0, ignore_eos=True, regex="[ab]{6}")
    d.submit(ids[3], "re-bad", max_new_tokens=6, temperature=0, ignore_eos=True, regex="[cd]{6}")
    while d.find("re-bad") is None or d.find("re-bad") in d.s.queues.grammar_pending:
        d.step()
    victim = d.find("re-bad").grammar
    backend = d.s.grammar.backend
    fill = backend.fill_vocab_masks

    def failing_fill(grammars, mask, rows):
        if any(g is victim for g in grammars):
            raise RuntimeError("mask exploded")
        return fill(grammars, mask, rows)

    backend.fill_vocab_masks = failing_fill
    d.run()
    bad = d.results["re-bad"].finish_reason
    assert (
        bad["type"] == "abort" and bad["status_code"] == 500 and "mask exploded" in bad["message"]
    )
    ok = d.results["re-ok"]
    assert ok.finish_reason["type"] == "stop"  # the grammar completed
    assert re.fullmatch(
        "[ab]{6}", d.s.tokenizer.get().decode(ok.output_ids, skip_special_tokens=True)
    )
    assert_idle_memory_ok(d.s)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_a_failing_forward_fails_its_batch_and_the_scheduler_goes_on(
    tiny_model_dir, tiny_hf_model, overlap
):
    rng = random.Random(16)
    d = Driver(make_scheduler(tiny_model_dir, enable_overlap_schedule=overlap))
    forward, calls = d.s.runner.forward, []

    def flaky(fb):
        calls.append(fb.forward_mode)
        if len(calls) == 3:
            raise RuntimeError("device fell over")
        return forward(fb)

    d.s.runner.forward = flaky
    a, b = prompt(rng, 7), prompt(rng, 11)
    d.submit(a, "a", max_new_tokens=5, temperature=0, ignore_eos=True)
    d.run()
    assert d.results["a"].finish_reason["status_code"] == 500
    assert "device fell over" in d.results["a"].finish_reason["message"]
    assert d.results["a"].finishes == 1
    d.submit(b, "b", max_new_tokens=5, temperature=0, ignore_eos=True)
    d.run()
    assert d.results["b"].output_ids == hf_greedy(tiny_hf_model, b, 5)
    assert_idle_memory_ok(d.s)


def test_bad_logprob_start_never_reaches_the_scheduler(tiny_model_dir):
    """Validation happens once, where the request is built (the tokenizer manager): a typed request
    with a logprob start past its prompt cannot be made; the scheduler trusts what it gets."""
    d = Driver(make_scheduler(tiny_model_dir))
    with pytest.raises(ValueError, match="logprob_start_len 3 must be below the prompt length 3"):
        d.submit([5, 6, 7], "bad", max_new_tokens=2, return_logprob=True, logprob_start_len=3)
    d.submit(
        [5, 6, 7], "good", max_new_tokens=2, temperature=0, return_logprob=True, logprob_start_len=2
    )
    d.run()
    assert d.s.queues.find("bad") is None and d.results["bad"].finishes == 0
    assert d.results["good"].finish_reason == {"type": "length", "length": 2}
    assert len(d.results["good"].input_token_logprobs) == 1
    assert_idle_memory_ok(d.s)
