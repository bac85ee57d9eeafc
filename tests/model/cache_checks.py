"""The radix cache's end-to-end checks that every model family passes (issue 90's acceptance; first
written for the window-aware cache, tests/model/test_swa_cache.py): a second turn reuses the first
one's prompt, a branch at 512 of a cached 700-token prompt reuses at least 256 tokens, and after
evictions through a small pool the answers are still HF's greedy tokens (near-tie rule), with the
scheduler's invariant checks after every step and every slot free at the end. The model needs
max_position_embeddings >= 1024; a windowed model's checks cover its windowed-layer slots too.
The reference is HF's greedy tokens, or the engine's own answer outside the cache (Uncached)."""

from __future__ import annotations

import random
import weakref

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.windowed_checkpoints import VOCAB, reference

SP = {"temperature": 0, "ignore_eos": True}


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def engine(path: str, **kw) -> Engine:
    return Engine(
        model_path=path,
        quantization="none",
        enable_invariant_checks=True,
        log_level="warning",
        **kw,
    )


def generate(e: Engine, prompt: list[int], n: int) -> dict:
    return e.generate(input_ids=prompt, sampling_params={**SP, "max_new_tokens": n})


# HF model -> {(prompt, n): reference}: a prompt asked again (the eviction rounds) is not rerun.
_REFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Uncached:
    """The engine's own answer to the same prompt outside the radix cache (a cache_salt of its
    own: no prefix shared), which a cached answer must equal exactly: the reference of the cache
    checks where HF's is slow to compute (the state-space families; their HF agreement is
    check_greedy's)."""

    def __init__(self, e: Engine):
        self.e, self.answers, self.count = e, {}, 0

    def answer(self, prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in self.answers:
            self.count += 1
            out = self.e.generate(
                input_ids=prompt,
                sampling_params={**SP, "max_new_tokens": n},
                cache_salt=f"uncached-{self.count}",
            )
            assert out["meta_info"]["cached_tokens"] == 0
            self.answers[key] = out["output_ids"]
        return self.answers[key]


def check(out: dict, hf, prompt: list[int], n: int, label: str) -> None:
    """out is the reference's answer: hf's greedy tokens (near-tie rule), or an Uncached's."""
    if isinstance(hf, Uncached):
        assert out["output_ids"] == hf.answer(prompt, n), f"{label}: cached != uncached"
        return
    refs = _REFS.setdefault(hf, {})
    key = (tuple(prompt), n)
    if key not in refs:
        refs[key] = reference(hf, prompt, n)
    assert_greedy_equal(out["output_ids"], refs[key], label)


def assert_all_free(e: Engine) -> None:
    """Nothing held once idle and flushed: every slot free (of both spaces where windowed)."""
    assert e.flush_cache()
    info = e.get_internal_state()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    if "swa_kv_tokens" in info:
        assert info["available_swa_kv_tokens"] == info["swa_kv_tokens"]


def check_cached_prefixes_stay_reusable(e: Engine, hf, label: str = "") -> None:
    """In a running engine (a pool of >= 2048 tokens): a second turn reuses the first turn's
    whole prompt; a prompt sharing the first 512 tokens of a cached 700-token one reuses at least
    256 of them; HF's tokens for each (hf: HF's model, or an Uncached whose answers they equal)."""
    turn1 = ids(2, 40)
    out1 = generate(e, turn1, 24)
    check(out1, hf, turn1, 24, f"{label} turn 1")
    turn2 = turn1 + out1["output_ids"] + ids(3, 12)
    out2 = generate(e, turn2, 16)
    assert out2["meta_info"]["cached_tokens"] >= len(turn1), label
    check(out2, hf, turn2, 16, f"{label} turn 2")

    long = ids(4, 700)
    check(generate(e, long, 4), hf, long, 4, f"{label} 700 tokens")
    branch = long[:512] + ids(5, 60)
    out = generate(e, branch, 12)
    assert out["meta_info"]["cached_tokens"] >= 256, label
    check(out, hf, branch, 12, f"{label} branch at 512")
    assert_all_free(e)


def check_cached_prefixes(path: str, hf, label: str = "", **engine_args) -> None:
    """check_cached_prefixes_stay_reusable in an engine of its own (a pool of 2048 tokens)."""
    with engine(path, max_total_tokens=2048, **engine_args) as e:
        check_cached_prefixes_stay_reusable(e, hf, label)


def check_evictions(e: Engine, hf, label: str = "") -> None:
    """In a running engine whose pool holds about two of these prompts (max_total_tokens 200; a
    windowed model's windowed-layer slots halved by swa_full_tokens_ratio=0.5): prompts that
    share prefixes, alone and batched, evicting each other; HF's tokens (or an Uncached's), and
    every slot free at the end."""
    stem = ids(6, 30)
    prompts = [stem + ids(10 + i, 20 + 7 * i) for i in range(4)] + [ids(20, 45)]
    for rnd in range(2):
        for i, p in enumerate(prompts):
            check(generate(e, p, 16), hf, p, 16, f"{label} round {rnd} #{i}")
    outs = e.generate(input_ids=prompts[:3], sampling_params={**SP, "max_new_tokens": 16})
    for i, out in enumerate(outs):
        check(out, hf, prompts[i], 16, f"{label} batched #{i}")
    assert_all_free(e)


def check_eviction_through_a_small_pool(path: str, hf, label: str = "", **engine_args) -> None:
    """check_evictions in an engine of its own (engine_args: swa_full_tokens_ratio=0.5 for a
    windowed model)."""
    with engine(path, max_total_tokens=200, chunked_prefill_size=32, **engine_args) as e:
        check_evictions(e, hf, label)


def check_greedy(e: Engine, hf, label: str) -> None:
    """In a running engine (prefill chunks of windowed_checkpoints.CHUNK): windowed_checkpoints'
    check_greedy prompts alone and then batched give HF's tokens."""
    from tests.model.windowed_checkpoints import NEW, _references

    prompts, refs = _references(hf)
    sp = {**SP, "max_new_tokens": NEW}
    for i, p in enumerate(prompts):
        assert e.flush_cache()
        out = e.generate(input_ids=p, sampling_params=sp)
        assert_greedy_equal(out["output_ids"], refs[i], f"{label} alone #{i}")
    assert e.flush_cache()
    for i, out in enumerate(e.generate(input_ids=prompts, sampling_params=sp)):
        assert_greedy_equal(out["output_ids"], refs[i], f"{label} batched #{i}")


def check_greedy_and_cache(
    path: str, hf, label: str, uncached_reference: bool = False, chunk: int = 0, **engine_args
) -> None:
    """A family's checkpoint in one engine: check_greedy, then
    check_cached_prefixes_stay_reusable against HF or (uncached_reference) the engine's own
    Uncached answers."""
    from tests.model.windowed_checkpoints import CHUNK

    with engine(path, chunked_prefill_size=chunk or CHUNK, **engine_args) as e:
        check_greedy(e, hf, label)
        check_cached_prefixes_stay_reusable(e, Uncached(e) if uncached_reference else hf, label)


def check_greedy_and_evictions(
    path: str, hf, label: str, uncached_reference: bool = False, chunk: int = 0, **engine_args
) -> None:
    """A family's other file (its GGUF) in one engine with a pool of 200 tokens: check_greedy,
    then check_evictions against HF or the engine's own Uncached answers (engine_args:
    swa_full_tokens_ratio=0.5 for a windowed model)."""
    from tests.model.windowed_checkpoints import CHUNK

    with engine(
        path, max_total_tokens=200, chunked_prefill_size=chunk or CHUNK, **engine_args
    ) as e:
        check_greedy(e, hf, label)
        check_evictions(e, Uncached(e) if uncached_reference else hf, label)
