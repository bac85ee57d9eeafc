"""The overlap scheduler (one decode step in flight while the next is built) gives exactly the
outputs of the plain loop, stops where it should, and leaks nothing (enable_invariant_checks checks
KV ownership after every step)."""

import random
import threading

import pytest

from radixlm import Engine
from tests.conftest import engine_args


def workload(engine):
    """Mixed requests; the stopping ones stop on a token / text the model is known to produce."""
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 40000) for _ in range(rng.randrange(4, 90))] for _ in range(24)]
    sps = []
    for i in range(len(prompts)):
        sp = {
            "max_new_tokens": rng.choice([1, 2, 3, 7, 16, 33]),
            "temperature": 0,
            "ignore_eos": True,
        }
        if i % 6 == 2:
            sp["min_new_tokens"] = min(3, sp["max_new_tokens"])
        if i % 5 == 3:  # stops early on a token or a string of its greedy output
            ref = engine.generate(
                input_ids=prompts[i], sampling_params={**sp, "max_new_tokens": 12}
            )["output_ids"]
            sp.update(
                max_new_tokens=33, stop_token_ids=[ref[5]], stop=[engine.tokenizer.decode(ref[2:4])]
            )
        if i % 7 == 4:
            sp["frequency_penalty"] = 0.5
        sps.append(sp)
    return prompts, sps


def run(engine, prompts, sps):
    """Half the requests at once; the other half arrive while the first decode."""
    half = len(prompts) // 2
    late = {}

    def second_wave():
        late["outs"] = engine.generate(input_ids=prompts[half:], sampling_params=sps[half:])

    t = threading.Thread(target=second_wave)
    first = engine.generate(input_ids=prompts[0], sampling_params=sps[0])
    t.start()
    outs = [first] + engine.generate(input_ids=prompts[1:half], sampling_params=sps[1:half])
    t.join()
    outs += late["outs"]
    return [
        (o["output_ids"], o["meta_info"]["finish_reason"], o["meta_info"]["completion_tokens"])
        for o in outs
    ]


@pytest.mark.parametrize("chunk", [-1, 32])
def test_overlap_gives_the_plain_loops_outputs(tiny_model_dir, chunk):
    results, work = {}, None
    for overlap in (False, True):
        with Engine(
            tiny_model_dir,
            **engine_args(
                enable_overlap_schedule=overlap, chunked_prefill_size=chunk, max_running_requests=8
            ),
        ) as e:
            prompts, sps = work = work or workload(e)
            results[overlap] = run(e, prompts, sps)
            # A second pass on a warm cache, and greedy-only decoding that overlaps throughout.
            results[overlap] += run(e, prompts, sps)
            greedy = [{"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}] * 6
            results[overlap] += run(e, prompts[:6], greedy)
            share = e.get_internal_state()[
                "decode_outside_share"
            ]  # measured over back-to-back decode steps
            assert isinstance(share, float) and 0.0 <= share < 1.0
    assert results[True] == results[False]
    reasons = {r["type"] for _, r, _ in results[True]}
    assert reasons == {"length", "stop"}  # both kinds of ending were exercised
