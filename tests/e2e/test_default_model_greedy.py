"""The default model (SmolLM2-135M-Instruct) against HF transformers `generate`, token for token:
alone, concurrent, with cached prefixes, chunked prefill, and without the radix cache."""

import pytest
import torch

from radixlm import Engine
from tests.hf_generate import greedy_batch

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


@pytest.fixture(scope="module")
def reference(default_model_path, hf_default_model):
    """Greedy outputs of HF transformers and its logits along them (for the near-tie rule)."""
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
    gens = greedy_batch(hf, ids, NEW_TOKENS, eos_token_id=2, pad_token_id=2)
    refs = []
    with torch.no_grad():
        for p, gen in zip(ids, gens):
            logits = hf(torch.tensor([p + gen])).logits[0, len(p) - 1 :]  # row k predicts gen[k]
            refs.append((p, gen, logits))
    del hf
    return prompts, refs


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
    prompts, refs = reference
    with Engine(enable_invariant_checks=True, log_level="warning", quantization="none") as engine:
        # Alone: two chat and two raw prompts (each alone is a whole float32 decode of 64 steps;
        # all eight run batched and cached below).
        for i, p in enumerate(prompts):
            if i not in ALONE:
                continue
            assert engine.flush_cache()
            out = engine.generate(p, SP)
            assert_greedy_equal(out["output_ids"], refs[i], f"alone #{i}")
            assert out["meta_info"]["cached_tokens"] == 0
        assert engine.flush_cache()
        outs = engine.generate(prompts, SP)
        for i, out in enumerate(outs):
            assert_greedy_equal(out["output_ids"], refs[i], f"concurrent #{i}")
        outs = engine.generate(prompts, SP)  # every prompt is now in the radix tree
        for i, out in enumerate(outs):
            assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
            assert_greedy_equal(out["output_ids"], refs[i], f"cached #{i}")


@pytest.mark.parametrize(
    "options",
    [dict(chunked_prefill_size=32), dict(disable_radix_cache=True)],
    ids=["chunked32", "no-radix-cache"],
)
def test_default_engine_variants(reference, options):
    prompts, refs = reference
    with Engine(
        enable_invariant_checks=True, log_level="warning", quantization="none", **options
    ) as engine:
        outs = engine.generate(prompts, SP)
        for i, out in enumerate(outs):
            assert_greedy_equal(out["output_ids"], refs[i], f"{options} #{i}")
            if options.get("disable_radix_cache"):
                assert out["meta_info"]["cached_tokens"] == 0
