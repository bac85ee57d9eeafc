"""The default model (SmolLM2-135M-Instruct) against HF transformers' greedy decoding, token for
token: alone, concurrent, with cached prefixes, chunked prefill, and without the radix cache. Each
output is checked along HF's logits over the prompt and the output itself (one forward per
distinct output; every token HF's argmax after the ones before it is HF's greedy continuation)."""

import pytest
import torch

from radixlm import Engine

NEW_TOKENS = 64
# A divergence is accepted only where the reference's top-2 logit gap is below this
# (a genuine float32 near-tie that batching may flip); the continuations are compared up to it.
NEAR_TIE = 1e-3

CHAT = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Translate 'good morning, my friend' into Spanish.",
    "Give me a Python function that reverses a string.",
]
RAW = [
    "The quick brown fox",
    "Once upon a time, in a small village by the mountains,",
    "1, 1, 2, 3, 5, 8, 13,",
]


EOS = 2


@pytest.fixture(scope="module")
def reference(default_model_path, hf_default_model):
    """The prompts, and check(i, output, label): asserts that output is HF transformers' greedy
    continuation of prompt i (assert_hf_greedy), HF's logits along it computed once per distinct
    output (one forward each, not 64 decode steps of HF's `generate`)."""
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True
        )
        for c in CHAT
    ] + RAW
    hf = hf_default_model()
    ids = [tok.encode(p) for p in prompts]
    logits: dict[tuple, torch.Tensor] = {}

    def check(i: int, got: list[int], label: str) -> None:
        key = (i, tuple(got))
        if key not in logits:
            with torch.no_grad():  # row k predicts got[k]
                logits[key] = hf(torch.tensor([ids[i] + got])).logits[0, len(ids[i]) - 1 :]
        assert_hf_greedy(got, logits[key], label)

    return prompts, check


def assert_hf_greedy(got: list[int], logits: torch.Tensor, label: str) -> None:
    """got: an engine's greedy tokens (at most NEW_TOKENS, stopping at EOS); logits: HF's along
    the prompt and got (row k predicts got[k]). Each token HF's argmax after the tokens before it
    makes got, by induction, HF's own greedy continuation; a token that is not is accepted only
    where HF's logit for it is within NEAR_TIE of the top (a genuine float32 near-tie that
    batching may flip), the continuations compared up to it. Shorter than NEW_TOKENS only by an
    EOS that HF chose too."""
    for k, t in enumerate(got):
        row = logits[k]
        if row.argmax().item() != t:
            gap = (row.max() - row[t]).item()
            assert gap < NEAR_TIE, (
                f"{label}: token {k} is {t}, HF's greedy choice is {row.argmax().item()} by a clear"
                f" gap {gap:.4g}"
            )
            return  # a genuine near-tie: the tokens up to here matched
    assert len(got) == NEW_TOKENS or got[-1] == EOS, f"{label}: stopped after {len(got)} tokens"


def assert_greedy_equal(got: list[int], ref: tuple, label: str, near_tie: float = NEAR_TIE) -> None:
    """ref: (prompt ids, HF's greedy tokens, HF's logits along them); near_tie: the gap under which
    a flip is a genuine tie (float32's here; tests/gpu passes bfloat16's)."""
    ids, gen, logits = ref
    for k, (a, b) in enumerate(zip(got, gen)):
        if a != b:
            top2 = torch.topk(logits[k], 2).values
            gap = (top2[0] - top2[1]).item()
            assert gap < near_tie, (
                f"{label}: token {k} differs ({a} vs HF {b}) with a clear top-2 gap {gap:.4g}"
            )
            return  # a genuine near-tie: the tokens up to here matched
    assert len(got) == len(gen), f"{label}: {len(got)} tokens vs HF {len(gen)}"


SP = {"max_new_tokens": NEW_TOKENS, "temperature": 0}
ALONE = (0, 1, len(CHAT), len(CHAT) + 1)


def test_default_engine_alone_concurrent_and_cached(reference):
    prompts, check = reference
    with Engine(enable_invariant_checks=True, log_level="warning", quantization="none") as engine:
        # Alone: two chat and two raw prompts (each alone is a whole float32 decode of 64 steps;
        # all eight run batched and cached below).
        for i, p in enumerate(prompts):
            if i not in ALONE:
                continue
            assert engine.flush_cache()
            out = engine.generate(p, SP)
            check(i, out["output_ids"], f"alone #{i}")
            assert out["meta_info"]["cached_tokens"] == 0
        assert engine.flush_cache()
        outs = engine.generate(prompts, SP)
        for i, out in enumerate(outs):
            check(i, out["output_ids"], f"concurrent #{i}")
        outs = engine.generate(prompts, SP)  # every prompt is now in the radix tree
        for i, out in enumerate(outs):
            assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
            check(i, out["output_ids"], f"cached #{i}")


@pytest.mark.parametrize(
    "options",
    [dict(chunked_prefill_size=32), dict(disable_radix_cache=True)],
    ids=["chunked32", "no-radix-cache"],
)
def test_default_engine_variants(reference, options):
    prompts, check = reference
    with Engine(
        enable_invariant_checks=True, log_level="warning", quantization="none", **options
    ) as engine:
        outs = engine.generate(prompts, SP)
        for i, out in enumerate(outs):
            check(i, out["output_ids"], f"{options} #{i}")
            if options.get("disable_radix_cache"):
                assert out["meta_info"]["cached_tokens"] == 0
