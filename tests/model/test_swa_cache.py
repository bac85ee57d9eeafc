"""Issue 64's window-aware cache (cache/swa_pool.py, cache/swa_radix_cache.py,
scheduler/kv/window_tracker.py) end to end on a tiny gpt-oss (window 8, float32): windowed layers
in their own small slot space, running requests keeping only their window of it, and the radix
cache still exact: HF's greedy tokens (near-tie rule) in every case below, with the scheduler's
invariant checks (slot ownership of both spaces, the pins) after every step."""

from __future__ import annotations

import random

import pytest

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.cache_checks import (
    check_cached_prefixes_stay_reusable,
    check_eviction_through_a_small_pool,
)
from tests.model.gemma4_checkpoint import DENSE, gemma4_checkpoint
from tests.model.gpt_oss_checkpoint import gpt_oss_checkpoint
from tests.model.windowed_checkpoints import VOCAB, WINDOW, reference

SP = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gpt_oss_swa"))
    return path, gpt_oss_checkpoint(path, max_position_embeddings=1024)


@pytest.fixture(scope="module", params=["gpt-oss", "gemma4"])
def any_model(request, tmp_path_factory):
    """gpt-oss (one KV shape), and Gemma 4 (per-layer shapes, layers reading others' KV)."""
    if request.param == "gpt-oss":
        return request.getfixturevalue("model")
    path = str(tmp_path_factory.mktemp("gemma4_swa"))
    return path, gemma4_checkpoint(path, max_position_embeddings=1024, **DENSE)


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def _engine(path: str, **kw) -> Engine:
    return Engine(
        model_path=path,
        quantization="none",
        enable_invariant_checks=True,
        log_level="warning",
        **kw,
    )


def _gen(engine: Engine, ids: list[int], n: int) -> dict:
    return engine.generate(input_ids=ids, sampling_params={**SP, "max_new_tokens": n})


def _check(out: dict, hf, ids: list[int], n: int, label: str) -> None:
    assert_greedy_equal(out["output_ids"], reference(hf, ids, n), label)


def _assert_all_free(engine: Engine) -> None:
    """Nothing held once idle and flushed: every slot of both spaces free."""
    assert engine.flush_cache()
    info = engine.get_internal_state()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    assert info["available_swa_kv_tokens"] == info["swa_kv_tokens"]


def test_a_long_context_runs_in_a_few_windows_of_slots(model):
    """A 150-token prompt and a 120-token answer (270 tokens) through 48 windowed-layer slots
    (6 windows): the prompt prefills in chunks the small space allows, the answer keeps its window
    only; HF's tokens."""
    path, hf = model
    ids = _ids(1, 150)
    with _engine(path, max_total_tokens=400, swa_full_tokens_ratio=0.12) as engine:
        info = engine.get_internal_state()
        assert info["swa_kv_tokens"] == 48 and info["swa_window"] == WINDOW
        out = _gen(engine, ids, 120)
        _check(out, hf, ids, 120, "long context")
        _assert_all_free(engine)


def test_cached_prefixes_stay_reusable(any_model):
    """A second turn reuses the first turn's whole prompt; a prompt sharing the first 512 tokens
    of a cached 700-token one reuses at least 256 of them; HF's tokens for each
    (cache_checks.py, which every family's tests run)."""
    path, hf = any_model
    with _engine(path, max_total_tokens=2048) as engine:
        check_cached_prefixes_stay_reusable(engine, hf)


def test_eviction_through_a_small_pool(any_model):
    """Prompts that share prefixes, alone and batched, through a pool that holds about two of them
    (and half as many windowed-layer slots): full and windowed evictions between them; HF's
    tokens, and every slot of both spaces free at the end."""
    path, hf = any_model
    check_eviction_through_a_small_pool(path, hf, swa_full_tokens_ratio=0.5)


def test_one_slot_space_when_disabled(model):
    """--disable-hybrid-swa-memory: no windowed-layer space, the same tokens."""
    path, hf = model
    ids = _ids(7, 30)
    with _engine(path, max_total_tokens=256, disable_hybrid_swa_memory=True) as engine:
        assert "swa_kv_tokens" not in engine.get_internal_state()
        _check(_gen(engine, ids, 16), hf, ids, 16, "one space")


def test_sglang_flags_reach_the_runner():
    """SGLang's flags: the ratio and the switch, and the server options that keep one space."""
    import argparse

    from radixlm.config import ServerArgs
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    read = lambda *a: ModelRunnerConfig.from_server_args(
        ServerArgs.from_cli_args(parser.parse_args(list(a)))
    )
    cfg = read("--swa-full-tokens-ratio", "0.3")
    assert cfg.swa_full_tokens_ratio == 0.3 and cfg.swa_memory_off is None
    assert read("--disable-hybrid-swa-memory").swa_memory_off == "--disable-hybrid-swa-memory"
    assert "speculative" in read("--speculative-algorithm", "ngram").swa_memory_off
    with pytest.raises(ValueError, match="swa_full_tokens_ratio"):
        read("--swa-full-tokens-ratio", "0")


def test_too_few_windowed_slots_is_refused_at_start_up(model):
    path, _ = model
    with pytest.raises(Exception, match="swa_full_tokens_ratio 0.1: 10 windowed-layer KV slots"):
        _engine(path, max_total_tokens=100, swa_full_tokens_ratio=0.1)


def test_aborts_disconnects_and_bad_input_leak_nothing(model):
    """Under a small pool: a stream aborted by id past its window, a stream its client leaves, and
    a prompt longer than the context (refused by name); then HF's tokens again and every slot of
    both spaces free."""
    path, hf = model
    with _engine(path, max_total_tokens=200, swa_full_tokens_ratio=0.5) as engine:
        sp = {**SP, "max_new_tokens": 150}
        seen = 0
        for chunk in engine.generate(
            input_ids=_ids(30, 20), sampling_params=sp, stream=True, rid="a"
        ):
            seen = len(chunk["output_ids"])
            if seen >= 3 * WINDOW:
                engine.abort_request("a")
        assert 3 * WINDOW <= seen < 150
        stream = engine.generate(input_ids=_ids(31, 20), sampling_params=sp, stream=True)
        for chunk in stream:
            if len(chunk["output_ids"]) >= 2 * WINDOW:
                break
        stream.close()  # the client leaves mid-answer
        with pytest.raises(Exception, match="context"):
            _gen(engine, _ids(32, 400), 4)
        ids = _ids(33, 25)
        _check(_gen(engine, ids, 16), hf, ids, 16, "after the failures")
        _assert_all_free(engine)
