"""A mixed workload for comparing scheduler loops (the overlap loop, mixed chunks, speculation)
against the plain loop, and the plain loop's answers to it: computed by one plain engine per
(model, chunked_prefill_size) per session (the `plain_loop` fixture, tests/conftest.py), not by a
fresh plain engine in every test that compares against them. Greedy outputs do not depend on the
batching or the cache (what these tests prove of the other loops), so the plain answers are the
same whichever test asked for them first."""

from __future__ import annotations

import random
import threading

from radixlm import Engine
from tests.conftest import engine_args

# Prompts that repeat themselves: prompt lookup and radix drafts find them (tests/speculative).
LOOPY = [
    [5 + (i % 7) for i in range(40)],
    [100, 200, 300, 100, 200, 300, 100, 200],
    list(range(1000, 1030)),
]
ECHO_GREEDY = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
# Greedy-only requests that overlap throughout (tests/engine/test_overlap.py).
GREEDY_SIX = [{"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}] * 6


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


def echo_prompts(engine) -> list[list[int]]:
    """Prompts P + G + P, G the model's greedy continuation of P: prompt lookup drafts G[1:] when
    the model starts its answer as it did the first time."""
    out = []
    for p in LOOPY:
        g = engine.generate(input_ids=p, sampling_params=ECHO_GREEDY)["output_ids"]
        out.append(p + g + p)
    return out


def loop_options(chunk: int, **options) -> dict:
    """The engine options of these comparisons: the plain loop's with `options` (a loop) on top."""
    return engine_args(chunked_prefill_size=chunk, max_running_requests=8, **options)


def plain_reference(model_dir: str, chunk: int) -> dict:
    """One plain engine's answers: the workload ("work") run twice (the second pass finds the
    first's outputs in the radix tree), the greedy-only requests, its decode_outside_share, and the
    echo prompts with their greedy outputs."""
    with Engine(model_dir, **loop_options(chunk)) as e:
        prompts, sps = workload(e)
        ref: dict = {"work": (prompts, sps)}
        ref["runs"] = [run(e, prompts, sps), run(e, prompts, sps)]
        ref["greedy"] = run(e, prompts[:6], GREEDY_SIX)
        ref["decode_outside_share"] = e.get_internal_state()["decode_outside_share"]
        echo = echo_prompts(e)
        outs = e.generate(input_ids=echo, sampling_params=[ECHO_GREEDY] * len(echo))
        ref["echo"] = (echo, [o["output_ids"] for o in outs])
    return ref
