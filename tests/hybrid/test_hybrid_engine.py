"""Hybrid models end to end (Engine): HF transformers' greedy tokens (float32, near-tie rule) on
prompts alone, batched and in prefill chunks smaller than the prompt, and the radix cache's state
snapshots: a turn 2 reuses turn 1's prompt and answer, a prompt branching off a long cached one
resumes at the last snapshot before the branch, and after many unrelated long prompts through a
small pool the same prompts still answer HF's tokens. Invariant checks (every KV slot and state
slot owned once) run after every step."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.hybrid.conftest import ENGINE_HYBRIDS

NEW = 10
VOCAB = 800  # the tiny tokenizer's ordinary tokens (its specials come after)
SP = {"max_new_tokens": NEW, "temperature": 0}


@pytest.fixture(scope="module", params=list(ENGINE_HYBRIDS))
def hybrid(request, hybrid_checkpoint_dir):
    from transformers import AutoModelForCausalLM

    path = hybrid_checkpoint_dir(request.param)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cache: dict[tuple, tuple] = {}

    def ref(ids: list[int], n: int = NEW) -> tuple:
        """(ids, HF's greedy tokens, HF's logits along them)."""
        if (tuple(ids), n) not in cache:
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
                gen = out[0, len(ids) :].tolist()
                logits = hf(torch.tensor([ids + gen])).logits[0, len(ids) - 1 :]
            cache[tuple(ids), n] = (ids, gen, logits)
        return cache[tuple(ids), n]

    # A small pool: 4k KV tokens, 24 state slots (prompts of 700 tokens evict each other).
    with Engine(
        model_path=path,
        quantization="none",
        enable_invariant_checks=True,
        chunked_prefill_size=100,
        max_total_tokens=4096,
        max_mamba_cache_size=24,
        log_level="warning",
    ) as engine:
        yield request.param, engine, ref


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def test_greedy_alone_batched_and_chunked(hybrid):
    name, engine, ref = hybrid
    rng = random.Random(1)
    prompts = [_tokens(rng, 7), _tokens(rng, 150), _tokens(rng, 300), [9] * 5]
    for i, p in enumerate(prompts):  # alone, nothing cached; 150 and 300 run in 100-token chunks
        assert engine.flush_cache()
        out = engine.generate(input_ids=p, sampling_params=SP)
        assert_greedy_equal(out["output_ids"], ref(p), f"{name} alone #{i}")
        assert out["meta_info"]["cached_tokens"] == 0
    assert engine.flush_cache()
    for i, out in enumerate(engine.generate(input_ids=prompts, sampling_params=SP)):
        assert_greedy_equal(out["output_ids"], ref(prompts[i]), f"{name} batched #{i}")


def test_prefix_reuse_ends_at_state_snapshots(hybrid):
    name, engine, ref = hybrid
    rng = random.Random(2)
    assert engine.flush_cache()
    turn1 = [_tokens(rng, 40), _tokens(rng, 700)]
    outs = engine.generate(input_ids=turn1, sampling_params=SP)
    assert len(outs) == len(turn1)
    turn2, answered = [], []
    for p, out in zip(turn1, outs):
        assert_greedy_equal(out["output_ids"], ref(p), f"{name} turn 1")
        turn2.append(p + out["output_ids"] + _tokens(rng, 5))
        answered.append(len(p) + len(out["output_ids"]))  # an EOS may end an answer early
    for t, n in zip(turn2, answered):  # one at a time: each reports its own reuse
        out = engine.generate(input_ids=t, sampling_params=SP)
        assert_greedy_equal(out["output_ids"], ref(t), f"{name} turn 2")
        # turn 1's prompt and answer (its last token's KV was never computed)
        assert out["meta_info"]["cached_tokens"] >= n - 1
    branch = turn1[1][:512] + _tokens(rng, 60)
    out = engine.generate(input_ids=branch, sampling_params=SP)
    assert_greedy_equal(out["output_ids"], ref(branch), f"{name} branch")
    assert out["meta_info"]["cached_tokens"] >= 256  # the snapshot at 512 (--mamba-track-interval)
    # A prompt that leaves the tree's KV past its match's snapshot (600 tokens of turn 1 there)
    # keeps a snapshot where it leaves: the next prompt sharing those 600 resumes at them.
    for i in range(2):
        fork = turn1[1][:600] + _tokens(rng, 30)
        out = engine.generate(input_ids=fork, sampling_params=SP)
        assert_greedy_equal(out["output_ids"], ref(fork), f"{name} fork #{i}")
        assert out["meta_info"]["cached_tokens"] == (512 if i == 0 else 600)

    # Unrelated long prompts through the small pool evict KV and snapshots; answers stay HF's.
    # 6 x 500 tokens after ~2,000: past the 4,096 KV slots and the 12 snapshot slots
    others = [_tokens(rng, 500) for _ in range(6)]
    for i, out in enumerate(engine.generate(input_ids=others, sampling_params=SP)):
        assert_greedy_equal(out["output_ids"], ref(others[i]), f"{name} churn #{i}")
    for t in [*turn2, branch]:
        out = engine.generate(input_ids=t, sampling_params=SP)
        assert_greedy_equal(out["output_ids"], ref(t), f"{name} after churn")
    # Nothing leaks: with the cache flushed every KV slot and state snapshot slot is free.
    assert engine.flush_cache()
    info = engine.get_internal_state()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    assert info["state_snapshot_slots_free"] == info["state_snapshot_slots"] > 0
    assert info["req_slots_free"] == info["req_slots_total"]


def test_the_same_prompt_again_reuses_all_but_its_last_token(hybrid):
    """A prompt sent again must compute its last token (its logits): the snapshot one token before
    the prompt's end serves it, and n > 1's copies alike; 101 tokens in chunks of 100: the last
    chunk is the last token alone, the snapshot one before it is the chunk before's end."""
    name, engine, ref = hybrid
    for n in (90, 101):
        assert engine.flush_cache()
        p = _tokens(random.Random(5), n)
        first = engine.generate(input_ids=p, sampling_params=SP)
        again = engine.generate(input_ids=p, sampling_params=SP)
        assert_greedy_equal(again["output_ids"], ref(p), f"{name} again ({n})")
        assert first["meta_info"]["cached_tokens"] == 0
        assert again["meta_info"]["cached_tokens"] == len(p) - 1, n
