"""Randomized scheduler test: a tiny random model, a ~300-token KV pool, chunks of 40 tokens,
requests of random lengths arriving over time (shared prefixes, prompt logprobs from random
positions, n > 1, regex constraints, stop tokens and strings), aborted at random moments
(waiting, compiling, chunking, decoding), with overlap on and off and the radix cache on and off.
The invariant check (every KV slot has one owner, every lock is held) runs after every step.

Every unaborted greedy request gives exactly the output (and prompt logprobs) of a quiet run
without aborts; an aborted greedy request's output is a prefix of it; every request gets exactly
one finish. `pytest -m soak` runs ten times as many requests."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from radixlm.speculative.draft_tree import CHAIN, DraftTree, TreeShape
from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler

POOL = 300
OPTIONS = dict(
    max_total_tokens=POOL, chunked_prefill_size=40, max_prefill_tokens=120, max_running_requests=8
)
REGEXES = ["[a-z]{3,8}", "(yes|no), because [a-z ]{2,12}", "[0-9]{1,4}(\\.[0-9]{1,2})?"]


@dataclass
class Spec:
    rid: str
    ids: list[int]
    sampling: dict
    logprob_start: int = -1
    top_n: int = 0
    arrival: int = 0  # step at which it is submitted

    @property
    def greedy(self) -> bool:
        return self.sampling.get("temperature", 1.0) == 0


@dataclass
class Run:
    results: dict
    aborted_in: dict = field(default_factory=dict)  # rid -> where it was when aborted
    steps: int = 0
    spec_stats: dict = field(default_factory=dict)


def workload(seed: int, n: int) -> list[Spec]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 40000) for _ in range(rng.randrange(20, 90))] for _ in range(3)]
    specs, step = [], 0
    for i in range(n):
        size = rng.choice([(1, 12), (12, 60), (60, 200)])
        tail = [rng.randrange(3, 40000) for _ in range(rng.randrange(*size))]
        ids = (rng.choice(prefixes) + tail)[:230] if rng.random() < 0.4 else tail
        sp = {
            "max_new_tokens": (
                rng.choice([0, 1, 2, 5, 9, 17, 24]) if rng.random() < 0.1 else rng.randrange(1, 25)
            ),
            "temperature": 0,
            "ignore_eos": True,
        }
        kind = rng.random()
        copies = 1
        if (
            kind < 0.12
        ):  # sampled, n > 1: copies with offset seeds, as the tokenizer manager sends them
            sp.update(temperature=0.8, seed=rng.randrange(1000))
            copies = rng.choice([2, 3])
        elif kind < 0.17:  # greedy, n > 1
            copies = 2
        elif kind < 0.27:
            sp.update(regex=rng.choice(REGEXES), max_new_tokens=rng.randrange(4, 20))
        elif kind < 0.32:
            sp["stop"] = rng.choice([" the", "e", "\n"])
        elif kind < 0.36:
            sp["stop_token_ids"] = [rng.randrange(3, 40000)]
        start, top_n = -1, 0
        if rng.random() < 0.25:
            start, top_n = rng.randrange(0, len(ids)), rng.choice([0, 2])
        step += rng.choice([0, 0, 1, 2, 3])
        for j in range(copies):
            s = dict(sp)
            if "seed" in s:
                s["seed"] += j
            specs.append(Spec(f"q{i}-{j}", ids, s, start, top_n, step))
    return specs


def where(d: Driver, rid: str):
    q = d.s.queues
    if any(r.rid == rid for r in q.grammar_pending):
        return "compiling"
    if any(r.rid == rid for r in q.waiting):
        return "waiting"
    chunked = d.chunked()
    if chunked is not None and chunked.rid == rid:
        return "chunking"
    if any(r.rid == rid for r in q.running):
        return "decoding"
    return None


class NoisyDrafts:
    """Wraps a draft source and an oracle (the quiet run's greedy outputs): proposes the true
    continuation, the source's draft or random tokens, each kept, cut or corrupted at random, so
    verify steps see every accept / reject pattern (all, none, some, then a wrong token)."""

    def __init__(self, source, seed: int, oracle: dict):
        self.source, self.rng, self.oracle = source, random.Random(seed), oracle

    def propose(self, reqs, ks: list[int], shape=CHAIN) -> list:
        return [self.draft_for(r, k, shape) if k > 0 else [] for r, k in zip(reqs, ks)]

    def draft_for(self, req, k: int, shape):
        rng, roll = self.rng, self.rng.random()
        truth = self.oracle.get(req.rid)
        if truth is not None and roll < 0.6:
            draft = truth[len(req.output_ids) : len(req.output_ids) + k]
        elif roll < 0.8:
            (draft,) = self.source.propose([req], [k], shape)
            if isinstance(draft, DraftTree):
                return draft
        else:
            draft = [rng.randrange(3, 40000) for _ in range(rng.randrange(1, k + 1))]
        if draft and rng.random() < 0.4:
            cut = rng.randrange(len(draft))
            draft = draft[:cut] + [rng.randrange(3, 40000)] + draft[cut + 1 :]
        if len(draft) > 1 and shape.width > 1 and rng.random() < 0.5:
            return noisy_tree(rng, draft, k)
        return draft

    def draft_class(self, req) -> str:
        return self.source.draft_class(req)

    def on_verified(self, req, tree, accepted, rows) -> None:
        self.source.on_verified(req, tree, accepted, rows)

    def release(self, req) -> None:
        self.source.release(req)


def noisy_tree(rng: random.Random, chain: list[int], k: int) -> DraftTree:
    """chain as one path of a tree among random siblings and their children (at most k nodes):
    the true path's node comes first, later or not at all among its siblings, so acceptance walks
    every kind of branch."""
    tokens, parents, node, mine = [], [], -1, -1
    for t in chain:
        siblings = [rng.randrange(3, 40000) for _ in range(rng.randrange(0, 3))]
        at = rng.randrange(len(siblings) + 1)
        for j, s in enumerate(siblings[:at] + [t] + siblings[at:]):
            tokens.append(s)
            parents.append(node)
            if j == at:
                mine = len(tokens) - 1
            elif rng.random() < 0.3:
                tokens.append(rng.randrange(3, 40000))
                parents.append(len(tokens) - 2)
        node = mine
    return DraftTree(tuple(tokens), tuple(parents)).bounded(TreeShape(width=8), k)


def run(model_dir: str, specs: list[Spec], abort_seed, oracle: dict | None = None, **opts) -> Run:
    d = Driver(make_scheduler(model_dir, **OPTIONS, **opts))
    if oracle is not None:
        d.s.spec.controller.source = NoisyDrafts(
            d.s.spec.controller.source, abort_seed or 0, oracle
        )
    rng = random.Random(abort_seed)
    pending, live, out = list(specs), [], Run({})
    try:
        while pending or not d.idle():
            while pending and pending[0].arrival <= d.steps:
                sp = pending.pop(0)
                d.submit(
                    sp.ids,
                    sp.rid,
                    return_logprob=sp.logprob_start >= 0,
                    logprob_start_len=sp.logprob_start,
                    top_logprobs_num=sp.top_n,
                    **sp.sampling,
                )
                live.append(sp.rid)
            if abort_seed is not None and live and rng.random() < 0.08:
                # Half the time the request being chunked, if any: the rarest state to catch.
                chunked = d.chunked()
                rid = (
                    chunked.rid if chunked is not None and rng.random() < 0.5 else rng.choice(live)
                )
                state = where(d, rid)
                if state is not None:
                    out.aborted_in[rid] = state
                    d.abort(rid)
            d.step()
            live = [r for r in live if d.results[r].finish_reason is None]
            assert d.steps < 50 * len(specs) + 2000, "the scheduler stopped making progress"
        assert_idle_memory_ok(d.s)
        assert d.s.flush_cache().success
        assert d.s.runner.token_to_kv_pool.available_size() == POOL
    finally:
        d.s.executor.shutdown()
    out.results, out.steps = d.results, d.steps
    out.spec_stats = d.s.spec.info()
    return out


def compare(specs: list[Spec], quiet: Run, noisy: Run, label: str) -> None:
    for sp in specs:
        q, r = quiet.results[sp.rid], noisy.results[sp.rid]
        assert q.finishes == 1 and r.finishes == 1, (label, sp.rid, q.finishes, r.finishes)
        if sp.rid in noisy.aborted_in and r.finish_reason["type"] == "abort":
            if sp.greedy:
                assert q.output_ids[: len(r.output_ids)] == r.output_ids, (
                    label,
                    sp.rid,
                    "aborted output",
                )
            continue
        assert r.finish_reason["type"] in ("length", "stop"), (label, sp.rid, r.finish_reason)
        assert len(r.output_ids) <= sp.sampling["max_new_tokens"]
        if not sp.greedy:
            continue
        assert r.output_ids == q.output_ids, (label, sp.rid)
        assert r.finish_reason == q.finish_reason, (label, sp.rid)
        if sp.logprob_start >= 0:
            assert (
                len(r.input_token_logprobs)
                == len(q.input_token_logprobs)
                == len(sp.ids) - sp.logprob_start
            )
            for (a, ta), (b, tb) in zip(r.input_token_logprobs, q.input_token_logprobs):
                assert (
                    ta == tb and (a is None) == (b is None) and (a is None or abs(a - b) < 1e-4)
                ), (label, sp.rid)
            assert len(r.input_top_logprobs) == len(q.input_top_logprobs)


def check_matrix(model_dir: str, seed: int, n: int) -> None:
    specs = workload(seed, n)
    for cache in (
        True,
        False,
    ):  # jump-forward (cache only) re-tokenizes constrained outputs: one quiet run each
        quiet = run(model_dir, specs, None, disable_radix_cache=not cache)
        states: set = set()
        for overlap in (False, True):
            noisy = run(
                model_dir,
                specs,
                seed * 10 + overlap,
                disable_radix_cache=not cache,
                enable_overlap_schedule=overlap,
            )
            compare(specs, quiet, noisy, f"cache={cache} overlap={overlap}")
            states |= set(noisy.aborted_in.values())
        assert {"waiting", "chunking", "decoding"} <= states, states


def test_randomized_scheduler(tiny_model_dir):
    check_matrix(tiny_model_dir, seed=1, n=170)


@pytest.mark.parametrize("algorithm", ["ngram", "radix"])
def test_randomized_scheduler_speculative(tiny_model_dir, algorithm):
    """Speculative decoding under the same workload, aborts and a pool this small (drafts compete
    for slots, retraction): greedy outputs equal the quiet plain run's, invariants hold at every
    step, drafts are accepted and rejected."""
    specs = workload(seed=3, n=120)
    quiet = run(tiny_model_dir, specs, None)
    oracle = {sp.rid: quiet.results[sp.rid].output_ids for sp in specs if sp.greedy}
    # The fixed draft policy: step shapes do not depend on measured step times, so the run (and the
    # states its aborts land in) is the same every time.
    noisy = run(
        tiny_model_dir,
        specs,
        37,
        oracle=oracle,
        speculative_algorithm=algorithm,
        speculative_num_draft_tokens=5,
        speculative_draft_policy="fixed",
    )
    compare(specs, quiet, noisy, f"speculative={algorithm}")
    assert {"waiting", "decoding"} <= set(noisy.aborted_in.values())
    stats = noisy.spec_stats
    assert (
        stats["spec_verify_steps"] > 0
        and 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    )


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(2, 12))
def test_randomized_scheduler_soak(tiny_model_dir, seed):
    check_matrix(tiny_model_dir, seed=seed, n=170)
