"""Sessions on the in-process Engine: open_session, generate(session_params=...) (whole and
streamed), close_session; the turns match HF greedy on the concatenated history."""

import asyncio
import random

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with Engine(tiny_model_dir, **engine_args(max_total_tokens=300, max_sessions_per_key=2)) as e:
        yield e


def hf_greedy(hf, ids, n):
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(ids) :].tolist()


def test_engine_session_turns(engine, tiny_hf_model):
    rng = random.Random(5)
    sp = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    sid = engine.open_session(capacity_of_str_len=200)
    history: list[int] = []
    for k in range(3):
        new = [rng.randrange(3, 40000) for _ in range(8)]
        if k == 1:  # streamed: the last chunk is the whole turn
            out = list(
                engine.generate(
                    input_ids=new, sampling_params=sp, stream=True, session_params={"id": sid}
                )
            )[-1]
        else:
            out = engine.generate(input_ids=new, sampling_params=sp, session_params={"id": sid})
        assert out["output_ids"] == hf_greedy(tiny_hf_model, history + new, 4)
        assert out["meta_info"]["cached_tokens"] >= len(history) - 1
        history += new + out["output_ids"]
    assert engine.get_internal_state()["session_pinned_tokens"] == len(history) - 1
    out = asyncio.run(
        engine.async_generate(input_ids=[9], sampling_params=sp, session_params={"id": sid})
    )
    assert out["meta_info"]["prompt_tokens"] == len(history) + 1
    history += [9] + out["output_ids"]
    with pytest.raises(ValueError, match="session_params.offset"):
        engine.generate(
            input_ids=[5], sampling_params=sp, session_params={"id": sid, "offset": 10_000}
        )
    other = engine.open_session()
    with pytest.raises(ValueError, match="--max-sessions-per-key"):
        engine.open_session()
    engine.close_session(other)
    engine.close_session(sid)
    st = engine.get_internal_state()
    assert st["pinned_sessions"] == 0 and st["protected_tokens"] == 0
    with pytest.raises(ValueError, match="session_id"):
        engine.close_session(sid)
