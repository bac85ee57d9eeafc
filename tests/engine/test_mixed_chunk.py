"""Mixed chunk: new requests' prefill runs in one forward with the running requests' decode step.
Outputs equal those of separate prefill and decode steps, requests of every kind (stops, penalties,
min_new_tokens, chunked prefill, logprobs) go through mixed steps, and nothing leaks
(enable_invariant_checks checks KV ownership after every step)."""

import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.engine.workloads import loop_options, run


@pytest.mark.parametrize("chunk", [-1, 32])
def test_mixed_chunk_gives_the_separate_steps_outputs(tiny_model_dir, chunk, plain_loop):
    ref = plain_loop(tiny_model_dir, chunk)  # separate steps: the plain loop's answers
    prompts, sps = ref["work"]
    with Engine(tiny_model_dir, **loop_options(chunk, enable_mixed_chunk=True)) as e:
        got = run(e, prompts, sps) + run(e, prompts, sps)
        mixed_steps = e.get_internal_state()["mixed_steps"]
    assert got == ref["runs"][0] + ref["runs"][1]
    assert mixed_steps > 0  # the second wave joined while the first decoded


def test_mixed_chunk_logprobs_match_separate_steps(tiny_model_dir):
    """A decode step's logprobs inside a mixed forward equal those of a plain decode step."""
    import threading

    outs = {}
    for mixed in (False, True):
        with Engine(
            tiny_model_dir, **engine_args(enable_mixed_chunk=mixed, max_running_requests=8)
        ) as e:
            long = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}
            late = {}
            t = threading.Thread(
                target=lambda: late.setdefault(
                    "o",
                    e.generate(
                        input_ids=[[5 + i for i in range(50)]] * 3,
                        sampling_params={**long, "max_new_tokens": 5},
                        return_logprob=True,
                        logprob_start_len=10,
                    ),
                )
            )
            first = e.generate(input_ids=[7, 8, 9], sampling_params={**long, "max_new_tokens": 2})
            assert first["output_ids"]
            res = {}
            t2 = threading.Thread(
                target=lambda: res.setdefault(
                    "o",
                    e.generate(
                        input_ids=[11, 12, 13, 14], sampling_params=long, return_logprob=True
                    ),
                )
            )
            t2.start()
            t.start()
            t.join()
            t2.join()
            outs[mixed] = (res["o"], late["o"])
            if mixed:
                assert e.get_internal_state()["mixed_steps"] > 0
    (a, la), (b, lb) = outs[False], outs[True]
    assert a["output_ids"] == b["output_ids"]
    assert (
        len(a["meta_info"]["output_token_logprobs"])
        == len(b["meta_info"]["output_token_logprobs"])
        == len(a["output_ids"])
    )
    for x, y in zip(
        a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
    ):
        assert x[1] == y[1] and x[0] == pytest.approx(y[0], abs=1e-4)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x["output_ids"] == y["output_ids"]
        assert (
            len(x["meta_info"]["input_token_logprobs"])
            == len(y["meta_info"]["input_token_logprobs"])
            == 40
        )
        for p, q in zip(
            x["meta_info"]["input_token_logprobs"], y["meta_info"]["input_token_logprobs"]
        ):
            assert p[1] == q[1] and (p[0] is None) == (q[0] is None)
            if p[0] is not None:
                assert p[0] == pytest.approx(q[0], abs=1e-4)


def test_mixed_chunk_greedy_matches_hf(tiny_model_dir, tiny_hf_model):
    """Requests that join running ones through mixed steps (with and without a cached prefix)
    give HF's greedy tokens, and so do the running ones."""
    import random
    import threading

    import torch

    rng = random.Random(5)
    shared = [rng.randrange(3, 40000) for _ in range(60)]
    prompts = [[rng.randrange(3, 40000) for _ in range(rng.randrange(5, 40))] for _ in range(3)]
    prompts += [
        shared + [rng.randrange(3, 40000) for _ in range(rng.randrange(1, 8))] for _ in range(4)
    ]
    new = [60, 60, 60, 12, 12, 12, 12]
    refs = [
        tiny_hf_model.generate(
            torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(p) :].tolist()
        for p, n in zip(prompts, new)
    ]
    sps = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in new]
    with Engine(tiny_model_dir, **engine_args(enable_mixed_chunk=True)) as e:
        e.generate(input_ids=shared, sampling_params={"max_new_tokens": 0})  # cache the prefix
        first = {}
        t = threading.Thread(
            target=lambda: first.setdefault(
                "o", e.generate(input_ids=prompts[:3], sampling_params=sps[:3])
            )
        )
        t.start()
        later = [e.generate(input_ids=p, sampling_params=sp) for p, sp in zip(prompts[3:], sps[3:])]
        t.join()
        assert e.get_internal_state()["mixed_steps"] > 0
    assert [o["output_ids"] for o in first["o"] + later] == refs
