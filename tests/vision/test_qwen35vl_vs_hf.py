"""Qwen3.5 with images (Qwen3_5ForConditionalGeneration, and Qwen3_5MoeForConditionalGeneration)
against HF transformers on tiny random checkpoints, through the Engine: greedy tokens (the
near-tie rule) and their logprobs to 1e-4 of transformers' code evaluated in float64
(tests/hf_float64.py; in float32 transformers is itself up to 1.2e-4 from that on an AVX2-only
CPU) for one image, two images of different sizes (their own grids) and text alone, with chunked
prefill cutting every image span; the same prompt again resumes from the hybrid prefix cache's
snapshot past its images, with the same answer. The logprobs are what tells interleaved M-RoPE
from a sectioned or a plain one (the tiny model's greedy tokens do not)."""

import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.vision.conftest import load_hf_qwen
from tests.vision.qwen35vl_checkpoint import write_tiny_qwen35vl
from tests.vision.test_qwen2vl_vs_hf import IMG, hf_reference, urls

N = 16
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
CASES = [
    (f"<|im_start|>user\n{IMG}what is this?<|im_end|>\n<|im_start|>assistant\n", [(1, (40, 36))]),
    # 40x36: a grid of 4 rows of 5 tokens; 24x60: 8 rows of 3
    (f"user: {IMG} and {IMG} differ how?\nassistant:", [(2, (40, 36)), (3, (24, 60))]),
    ("<|im_start|>user\nwhat is a radix tree?<|im_end|>\n<|im_start|>assistant\n", []),
]
IDS = ["one", "two-sizes", "text-only"]


@pytest.fixture(scope="module")
def engine(tiny_qwen35vl_dir):
    # Chunks of 8 tokens: every image span (20, 24 tokens) is cut.
    with Engine(
        tiny_qwen35vl_dir, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)
    ) as e:
        yield e


def check_against_hf(out, tokens, logprobs, label):
    """HF's greedy tokens (a flip only at a near-tie), and the logprobs of the tokens up to it."""
    assert_greedy_equal(out["output_ids"], (None, tokens, logprobs), label)
    for step, (lp, tid, _) in enumerate(out["meta_info"]["output_token_logprobs"]):
        if out["output_ids"][: step + 1] != tokens[: step + 1]:
            break
        assert abs(lp - logprobs[step][tid].item()) < 1e-4, (label, step)


def generate(engine, text, images, **kw):
    return engine.generate(text, SP, image_data=urls(images) or None, **kw)


@pytest.mark.parametrize("text,images", CASES, ids=IDS)
def test_greedy_and_logprobs_match_hf_and_the_cache_resumes_past_the_images(
    engine, hf_qwen35vl, text, images
):
    inputs, tokens, logprobs = hf_reference(hf_qwen35vl, text, images, N)
    if images:
        grids = {tuple(g) for g in inputs["image_grid_thw"].tolist()}
        assert len(grids) == len(images)  # each image its own grid
    ids = inputs["input_ids"][0].tolist()
    image = [i for i, t in enumerate(ids) if t == hf_qwen35vl[0].config.image_token_id]
    engine.flush_cache()
    out = generate(engine, text, images, return_logprob=True, top_logprobs_num=5)
    check_against_hf(out, tokens, logprobs, "first")
    assert out["meta_info"]["cached_tokens"] == 0
    again = generate(engine, text, images, return_logprob=True)
    check_against_hf(again, tokens, logprobs, "again")
    # the snapshot one token before the prompt's end: past every image span
    assert again["meta_info"]["cached_tokens"] == len(ids) - 1
    if image:
        assert again["meta_info"]["cached_tokens"] > image[-1]


def test_moe_matches_hf(tmp_path_factory, tokenizer_dir):
    """Qwen3.5-MoE: its vision tower (Qwen3_5MoeVisionModel), experts in the hybrid decoder."""
    path = write_tiny_qwen35vl(
        str(tmp_path_factory.mktemp("tiny-qwen35vl-moe")), tokenizer_dir, True
    )
    hf = load_hf_qwen(path, "Qwen3_5MoeForConditionalGeneration", float64=True)
    text, images = CASES[1]
    _, tokens, logprobs = hf_reference(hf, text, images, N)
    with Engine(path, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        out = generate(e, text, images, return_logprob=True)
    check_against_hf(out, tokens, logprobs, "moe")
