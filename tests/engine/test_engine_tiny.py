"""Engine behaviour on a tiny random Llama: outputs against HF, logprobs, stops, streaming,
bad input, memory conservation and retraction."""

import asyncio
import random

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with Engine(tiny_model_dir, **engine_args(chunked_prefill_size=64)) as e:
        yield e


def hf_greedy(hf, ids, n):
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(ids) :].tolist()


def rand_prompt(rng, n):
    return [rng.randrange(3, 40000) for _ in range(n)]


def test_greedy_matches_hf_alone_and_batched(engine, tiny_hf_model):
    rng = random.Random(0)
    prompts = [rand_prompt(rng, n) for n in (5, 17, 80, 130)]  # 80 and 130 take chunks of 64
    sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    refs = [hf_greedy(tiny_hf_model, p, 12) for p in prompts]
    alone = [engine.generate(input_ids=p, sampling_params=sp)["output_ids"] for p in prompts]
    batched = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]
    assert alone == refs
    assert batched == refs


def test_prompt_logprobs_match_hf_with_and_without_cache(engine, tiny_hf_model):
    rng = random.Random(1)
    ids = rand_prompt(rng, 100)
    with torch.no_grad():
        ref = torch.log_softmax(tiny_hf_model(torch.tensor([ids])).logits[0].float(), -1)
    expect = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
    for start in (0, 30):
        for _ in range(2):  # the second run has the prompt cached: logprobs must not change
            out = engine.generate(
                input_ids=ids,
                sampling_params={"max_new_tokens": 0},
                return_logprob=True,
                logprob_start_len=start,
                top_logprobs_num=3,
            )
            lps = out["meta_info"]["input_token_logprobs"]
            assert len(lps) == len(ids) - start
            assert [t for _, t, _ in lps] == ids[start:]
            got = [lp for lp, _, _ in lps]
            if start == 0:
                assert got[0] is None
                got = got[1:]
            assert got == pytest.approx(expect[max(start - 1, 0) :], abs=1e-4)
            top = out["meta_info"]["input_top_logprobs"][-1]
            ref_top = torch.topk(ref[len(ids) - 2], 3)
            assert [t for _, t, _ in top] == ref_top.indices.tolist()
            assert out["meta_info"]["completion_tokens"] == 0 and out["output_ids"] == []
            assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_output_logprobs_match_hf(engine, tiny_hf_model):
    ids = rand_prompt(random.Random(2), 20)
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    full = ids + out["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(tiny_hf_model(torch.tensor([full])).logits[0].float(), -1)
    lps = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    for k, (lp, tok, text) in enumerate(lps):
        assert lp == pytest.approx(ref[len(ids) - 1 + k, tok].item(), abs=1e-4)
        assert isinstance(text, str)
    assert len(out["meta_info"]["output_top_logprobs"]) == 5


def test_stop_string_token_and_min_new_tokens(engine):
    ids = rand_prompt(random.Random(3), 10)
    base = engine.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    )
    toks = base["output_ids"]
    # Stop on the 4th generated token id.
    out = engine.generate(
        input_ids=ids,
        sampling_params={
            "max_new_tokens": 20,
            "temperature": 0,
            "stop_token_ids": [toks[3]],
            "ignore_eos": True,
        },
    )
    first = toks.index(toks[3])
    assert out["output_ids"] == toks[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": toks[3]}
    # min_new_tokens bans the stop token until then.
    out = engine.generate(
        input_ids=ids,
        sampling_params={
            "max_new_tokens": 20,
            "min_new_tokens": first + 2,
            "temperature": 0,
            "stop_token_ids": [toks[3]],
            "ignore_eos": True,
        },
    )
    assert len(out["output_ids"]) >= first + 2 and toks[3] not in out["output_ids"][: first + 2]
    # A stop string taken from the generated text is trimmed from the output text.
    text = base["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if stop.strip():
        out = engine.generate(
            input_ids=ids,
            sampling_params={
                "max_new_tokens": 20,
                "temperature": 0,
                "stop": stop,
                "ignore_eos": True,
            },
        )
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert out["text"] == text[: text.find(stop)]
        keep = engine.generate(
            input_ids=ids,
            sampling_params={
                "max_new_tokens": 20,
                "temperature": 0,
                "stop": stop,
                "no_stop_trim": True,
                "ignore_eos": True,
            },
        )
        assert keep["text"].startswith(text[: text.find(stop)] + stop)


def test_streaming_is_cumulative_and_ends_like_non_stream(engine):
    ids = rand_prompt(random.Random(4), 12)
    sp = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    chunks = list(engine.generate(input_ids=ids, sampling_params=sp, stream=True))
    final = engine.generate(input_ids=ids, sampling_params=sp)
    assert len(chunks) > 2
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"]) and len(b["output_ids"]) >= len(a["output_ids"])
    assert chunks[-1]["text"] == final["text"] and chunks[-1]["output_ids"] == final["output_ids"]


def test_seed_n_and_sampling(engine):
    ids = rand_prompt(random.Random(5), 8)
    sp = {"max_new_tokens": 8, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    a = engine.generate(input_ids=ids, sampling_params=sp)["output_ids"]
    b = engine.generate(input_ids=ids, sampling_params=sp)["output_ids"]
    assert a == b
    outs = engine.generate(input_ids=ids, sampling_params={**sp, "n": 3})
    assert isinstance(outs, list) and len(outs) == 3
    assert outs[0]["output_ids"] == a  # copy 0 keeps the seed; the others offset it
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    assert all(o["meta_info"]["cached_tokens"] == len(ids) - 1 for o in outs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(prompt=""), "empty"),
        (dict(input_ids=[]), "empty"),
        (dict(input_ids=[5] * 2000), "context length"),
        (dict(prompt="hi", sampling_params={"max_new_tokens": -1}), "max_new_tokens"),
        (dict(prompt="hi", sampling_params={"top_p": 0}), "top_p"),
        (dict(prompt="hi", sampling_params={"top_p": 1.2}), "top_p"),
        (dict(prompt="hi", sampling_params={"temperature": -1}), "temperature"),
        (dict(prompt="hi", sampling_params={"not_a_key": 1}), "not_a_key"),
        (dict(input_ids=[10**9]), "vocabulary"),
        (dict(input_ids=[5, 6, 7], return_logprob=True, logprob_start_len=3), "logprob_start_len"),
    ],
)
def test_bad_input_raises_and_engine_keeps_working(engine, kwargs, field):
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)
    out = engine.generate("hello", {"max_new_tokens": 2, "temperature": 0})
    assert out["meta_info"]["completion_tokens"] == 2


def test_unknown_engine_option():
    with pytest.raises(TypeError, match="bogus"):
        Engine(bogus=1)


def test_memory_conservation_after_random_requests_and_aborts(engine):
    rng = random.Random(6)

    async def one(i):
        n = rng.choice([1, 1, 1, 2, 3])
        sp = {
            "max_new_tokens": rng.randint(1, 24),
            "temperature": rng.choice([0, 0.8]),
            "n": n,
            "ignore_eos": rng.random() < 0.5,
        }
        ids = rand_prompt(rng, rng.randint(1, 150))
        if rng.random() < 0.2:  # aborted mid-stream: the consumer goes away
            agen = await engine.async_generate(input_ids=ids, sampling_params=sp, stream=True)
            async for _ in agen:
                break
            await agen.aclose()
            return None
        return await engine.async_generate(input_ids=ids, sampling_params=sp)

    async def main():
        results = []
        for start in range(0, 200, 25):
            results += await asyncio.gather(*[one(i) for i in range(start, start + 25)])
        return results

    results = asyncio.run(main())
    assert sum(r is not None for r in results) > 120
    for _ in range(50):  # aborts land asynchronously; wait for the scheduler to go idle
        st = engine.get_internal_state()
        if st["num_running"] == 0 and st["num_waiting"] == 0:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert st["protected_tokens"] == 0
    assert st["available_kv_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"]
    assert engine.flush_cache()
    st = engine.get_internal_state()
    assert st["available_kv_tokens"] == st["max_total_num_tokens"]
    assert st["req_slots_free"] == st["req_slots_total"]


def test_retraction_finishes_everything_with_the_alone_output(tiny_model_dir):
    rng = random.Random(7)
    prompts = [rand_prompt(rng, 30) for _ in range(8)]
    sp = {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}
    with Engine(tiny_model_dir, **engine_args(max_total_tokens=400)) as small:
        outs = small.generate(input_ids=prompts, sampling_params=sp)
        state = small.get_internal_state()
        alone = [small.generate(input_ids=p, sampling_params=sp)["output_ids"] for p in prompts]
    assert state["num_retracted"] > 0, "the pool was meant to be too small for all requests"
    assert [o["output_ids"] for o in outs] == alone
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)


@pytest.mark.parametrize("disable_radix_cache", [True, False], ids=["no-cache", "cache"])
def test_chunked_prefill_under_memory_pressure(tiny_model_dir, tiny_hf_model, disable_radix_cache):
    """Small chunks, a small pool and shared prefixes: every request finishes with HF's greedy
    output and the ownership check (enable_invariant_checks) holds after every step."""
    rng = random.Random(8)
    shared = rand_prompt(rng, 90)
    prompts = [shared + rand_prompt(rng, rng.randint(5, 40)) for _ in range(10)] + [
        rand_prompt(rng, 150)
    ]
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    refs = [hf_greedy(tiny_hf_model, p, 10) for p in prompts]
    opts = engine_args(
        chunked_prefill_size=16, max_total_tokens=700, disable_radix_cache=disable_radix_cache
    )
    with Engine(tiny_model_dir, **opts) as e:
        outs = e.generate(input_ids=prompts, sampling_params=sp)
        assert [o["output_ids"] for o in outs] == refs
        st = e.get_internal_state()
        assert st["available_kv_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"]
