"""WeightControl step by step (scheduler/control/weight_control.py), against HF transformers' greedy
outputs of checkpoints A and B: a weight update waits for the requests the scheduler got before it,
which finish on A; one that arrives after it waits and runs on B; an internal failure while loading
is a ControlFailed (a 500) and A serves on."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixlm.ipc import (
    ControlFailed,
    TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
)
from radixlm.model.executor import weight_update
from radixlm.sampling_params import SamplingParams
from tests.checkpoints import tiny_like
from tests.scheduler.harness import Driver, Result, assert_idle_memory_ok, hf_greedy, make_scheduler

PROMPT, LATER = [1, 450, 7483, 310, 3444, 338], [1, 822, 11, 4]
N = 16


@pytest.fixture(scope="module")
def ckpt_b(tiny_model_dir, tmp_path_factory):
    return tiny_like(tiny_model_dir, str(tmp_path_factory.mktemp("ckpt-b")), seed=1)


def _hf(path: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _send(d: Driver, rid: str, ids: list[int]) -> None:
    """A request as the tokenizer manager sends it (through Scheduler.handle)."""
    d.results[rid] = Result()
    sp = SamplingParams(max_new_tokens=N, temperature=0, ignore_eos=True)
    d.s.handle(
        TokenizedGenerateReqInput(
            rid=rid, input_text=None, input_ids=ids, sampling_params=sp, stream=True
        )
    )


def test_an_update_waits_for_the_requests_before_it(tiny_model_dir, ckpt_b):
    d = Driver(make_scheduler(tiny_model_dir))
    _send(d, "before", PROMPT)
    for _ in range(3):
        d.step()
    assert 0 < len(d.results["before"].output_ids) < N
    d.s.handle(UpdateWeightFromDiskReqInput(model_path=ckpt_b))
    _send(d, "after", LATER)  # held back until the update is done
    assert d.io.replies == [] and d.s.control.info()["weights"]["deferred_requests"] == 1
    while not d.io.replies:
        d.step()
    # The reply comes in the step "before" finishes, before "after" ran at all.
    assert d.results["before"].finish_reason is not None and d.results["after"].output_ids == []
    assert d.io.replies == [
        UpdateWeightFromDiskReqOutput(True, "Succeeded to update model weights.", 1)
    ]
    d.run()
    assert d.results["before"].output_ids == hf_greedy(_hf(tiny_model_dir), PROMPT, N)
    assert d.results["after"].output_ids == hf_greedy(_hf(ckpt_b), LATER, N)
    assert d.results["after"].cached_tokens == 0
    assert_idle_memory_ok(d.s)


def test_an_internal_failure_is_a_control_failed_and_a_serves_on(
    tiny_model_dir, ckpt_b, monkeypatch
):
    d = Driver(make_scheduler(tiny_model_dir))

    def no_room(*args, **kwargs):
        raise MemoryError("no room beside the served model")

    monkeypatch.setattr(weight_update, "load_model", no_room)
    d.s.handle(UpdateWeightFromDiskReqInput(model_path=ckpt_b))
    assert d.io.replies == [ControlFailed(UpdateWeightFromDiskReqOutput)]
    _send(d, "next", PROMPT)
    d.run()
    assert d.results["next"].output_ids == hf_greedy(_hf(tiny_model_dir), PROMPT, N)
    assert d.s.control.info()["weights"]["model_path"] == tiny_model_dir
