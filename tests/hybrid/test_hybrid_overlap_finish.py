"""A hybrid model under the overlap scheduler: an answer that stops at a stop token finishes while
a step of it is already in flight (the scheduler ran it on the last token before the finish was
known). That step's KV and state still become the answer's snapshot, and a next turn sent at once
waits for them: it reuses the whole prompt and answer (not only the prompt) and answers HF's greedy
tokens."""

from __future__ import annotations

import random

import torch

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal

VOCAB = 800  # the tiny tokenizer's ordinary tokens


def test_an_answer_stopped_in_flight_leaves_its_snapshot(hybrid_checkpoint_dir):
    from transformers import AutoModelForCausalLM

    path = hybrid_checkpoint_dir("qwen35")
    rng = random.Random(3)
    prompt = [rng.randrange(10, VOCAB) for _ in range(40)]
    with Engine(
        model_path=path,
        quantization="none",
        enable_invariant_checks=True,
        enable_overlap_schedule=True,
        log_level="warning",
    ) as engine:
        free = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 12})
        favorite = free["output_ids"][0]  # a tiny random model repeats one token
        # The text of 6 of them as a stop string: a finish the scheduler learns only from the
        # step's token (unlike max_new_tokens), so the next step is already in flight.
        stop = engine.tokenizer.decode([favorite] * 6)
        assert engine.flush_cache()
        sp = {"max_new_tokens": 12, "stop": [stop]}
        stopped = engine.generate(input_ids=prompt, sampling_params=sp)
        assert stopped["meta_info"]["finish_reason"]["type"] == "stop"
        answer = stopped["output_ids"]
        assert 6 <= len(answer) < 12, answer
        # sent at once: the release waits for the step in flight, and the scheduler processes
        # that step before admitting what arrived meanwhile (Scheduler.step_behind)
        turn2 = prompt + answer + [rng.randrange(10, VOCAB) for _ in range(6)]
        two = engine.generate(input_ids=turn2, sampling_params={"max_new_tokens": 8})
    # the prompt and the answer, up to its last token at least
    assert two["meta_info"]["cached_tokens"] >= len(prompt) + len(answer) - 1
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([turn2])
        gen = hf.generate(ids, max_new_tokens=8, do_sample=False)[0, len(turn2) :].tolist()
        logits = hf(torch.tensor([turn2 + gen])).logits[0, len(turn2) - 1 :]
    assert_greedy_equal(two["output_ids"], (turn2, gen, logits), "qwen35 turn 2 after a stop")
