"""The radix cache stays exact for a family (issue 90's acceptance), as test_swa_cache.py checks it
for the windowed ones: a second turn reuses the first turn's prompt, a branch at 512 of a cached
700-token prompt reuses >= 256 tokens, and prompts sharing prefixes through a pool that holds
about two of them (evictions between them) still get HF's greedy tokens (near-tie rule), with
the scheduler's invariant checks after every step. The checkpoint needs max_position_embeddings
>= 800."""

from __future__ import annotations

import random
import weakref

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.windowed_checkpoints import VOCAB, reference

SP = {"temperature": 0, "ignore_eos": True}


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


# HF model -> {(prompt, n): reference}: the eviction rounds ask for the same answers again.
_REFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check(out: dict, hf, ids: list[int], n: int, label: str) -> None:
    refs = _REFS.setdefault(hf, {})
    key = (tuple(ids), n)
    if key not in refs:
        refs[key] = reference(hf, ids, n)
    assert_greedy_equal(out["output_ids"], refs[key], label)


def _assert_all_free(engine: Engine) -> None:
    assert engine.flush_cache()
    info = engine.get_internal_state()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]


def check_cached_prefixes(path: str, hf, label: str) -> None:
    with _engine(path, max_total_tokens=2048) as engine:
        turn1 = _ids(2, 40)
        out1 = _gen(engine, turn1, 24)
        _check(out1, hf, turn1, 24, f"{label} turn 1")
        turn2 = turn1 + out1["output_ids"] + _ids(3, 12)
        out2 = _gen(engine, turn2, 16)
        assert out2["meta_info"]["cached_tokens"] >= len(turn1), label
        _check(out2, hf, turn2, 16, f"{label} turn 2")

        long = _ids(4, 700)
        _check(_gen(engine, long, 4), hf, long, 4, f"{label} 700 tokens")
        branch = long[:512] + _ids(5, 60)
        out = _gen(engine, branch, 12)
        assert out["meta_info"]["cached_tokens"] >= 256, label
        _check(out, hf, branch, 12, f"{label} branch at 512")
        _assert_all_free(engine)


def check_eviction(path: str, hf, label: str) -> None:
    stem = _ids(6, 30)
    prompts = [stem + _ids(10 + i, 20 + 7 * i) for i in range(4)] + [_ids(20, 45)]
    with _engine(path, max_total_tokens=200, chunked_prefill_size=32) as engine:
        for rnd in range(2):
            for i, p in enumerate(prompts):
                _check(_gen(engine, p, 16), hf, p, 16, f"{label} round {rnd} #{i}")
        outs = engine.generate(input_ids=prompts[:3], sampling_params={**SP, "max_new_tokens": 16})
        for i, out in enumerate(outs):
            _check(out, hf, prompts[i], 16, f"{label} batched #{i}")
        _assert_all_free(engine)
