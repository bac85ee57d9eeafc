"""The overlap scheduler (one decode step in flight while the next is built) gives exactly the
outputs of the plain loop, stops where it should, and leaks nothing (enable_invariant_checks checks
KV ownership after every step)."""

import pytest

from radixlm import Engine
from tests.engine.workloads import GREEDY_SIX, loop_options, run


@pytest.mark.parametrize("chunk", [-1, 32])
def test_overlap_gives_the_plain_loops_outputs(tiny_model_dir, chunk, plain_loop):
    ref = plain_loop(tiny_model_dir, chunk)  # the plain loop's answers (tests/engine/workloads.py)
    prompts, sps = ref["work"]
    with Engine(tiny_model_dir, **loop_options(chunk, enable_overlap_schedule=True)) as e:
        got = run(e, prompts, sps)
        # A second pass on a warm cache, and greedy-only decoding that overlaps throughout.
        got += run(e, prompts, sps)
        got += run(e, prompts[:6], GREEDY_SIX)
        # measured over back-to-back decode steps, by the overlap loop and by the plain loop
        shares = [e.get_internal_state()["decode_outside_share"], ref["decode_outside_share"]]
    for share in shares:
        assert isinstance(share, float) and 0.0 <= share < 1.0
    assert got == ref["runs"][0] + ref["runs"][1] + ref["greedy"]
    reasons = {r["type"] for _, r, _ in got}
    assert reasons == {"length", "stop"}  # both kinds of ending were exercised
