"""The radix cache stays exact for a model (issue 90's acceptance; test_swa_cache's two checks,
for any family, windowed layers or not): a second turn reuses the first turn's prompt, a branch at
512 of a cached 700-token prompt reuses >= 256 tokens, and prompts sharing prefixes through a pool
that holds about two of them (evictions between them, of the windowed-layer space too where the
model has one) still get HF's greedy tokens (near-tie rule); every slot free at the end. The
model needs max_position_embeddings >= 1024 and a vocabulary of VOCAB ordinary tokens."""

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


def gen(e: Engine, prompt: list[int], n: int) -> dict:
    return e.generate(input_ids=prompt, sampling_params={**SP, "max_new_tokens": n})


# model -> {(prompt, n): HF's reference}: the eviction check asks for each prompt's three times
_REFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check(out: dict, hf, prompt: list[int], n: int, label: str) -> None:
    refs = _REFS.setdefault(hf, {})
    key = (tuple(prompt), n)
    if key not in refs:
        refs[key] = reference(hf, prompt, n)
    assert_greedy_equal(out["output_ids"], refs[key], label)


def assert_all_free(e: Engine) -> None:
    """Nothing held once idle and flushed: every slot free (of both spaces with windows)."""
    assert e.flush_cache()
    info = e.get_internal_state()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    if "swa_kv_tokens" in info:
        assert info["available_swa_kv_tokens"] == info["swa_kv_tokens"]


def check_cached_prefixes(path: str, hf, label: str = "") -> None:
    """Turn 2 reuses turn 1's whole prompt; a branch at 512 of a cached 700-token prompt reuses
    at least 256 tokens; HF's tokens for each."""
    with engine(path, max_total_tokens=2048) as e:
        turn1 = ids(2, 40)
        out1 = gen(e, turn1, 24)
        check(out1, hf, turn1, 24, f"{label} turn 1")
        turn2 = turn1 + out1["output_ids"] + ids(3, 12)
        out2 = gen(e, turn2, 16)
        assert out2["meta_info"]["cached_tokens"] >= len(turn1)
        check(out2, hf, turn2, 16, f"{label} turn 2")

        long = ids(4, 700)
        check(gen(e, long, 4), hf, long, 4, f"{label} 700 tokens")
        branch = long[:512] + ids(5, 60)
        out = gen(e, branch, 12)
        assert out["meta_info"]["cached_tokens"] >= 256
        check(out, hf, branch, 12, f"{label} branch at 512")
        assert_all_free(e)


def check_eviction(path: str, hf, label: str = "") -> None:
    """Prompts that share prefixes, alone and batched, through a pool that holds about two of them
    (and half as many windowed-layer slots where the model has windows); HF's tokens, and every
    slot free at the end."""
    stem = ids(6, 30)
    prompts = [stem + ids(10 + i, 20 + 7 * i) for i in range(4)] + [ids(20, 45)]
    with engine(
        path, max_total_tokens=200, swa_full_tokens_ratio=0.5, chunked_prefill_size=32
    ) as e:
        for rnd in range(2):
            for i, p in enumerate(prompts):
                check(gen(e, p, 16), hf, p, 16, f"{label} round {rnd} #{i}")
        outs = e.generate(input_ids=prompts[:3], sampling_params={**SP, "max_new_tokens": 16})
        for i, out in enumerate(outs):
            check(out, hf, prompts[i], 16, f"{label} batched #{i}")
        assert_all_free(e)
