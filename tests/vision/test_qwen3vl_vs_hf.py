"""Qwen3-VL (Qwen3VLForConditionalGeneration, and Qwen3VLMoeForConditionalGeneration) with images
against HF transformers on tiny random checkpoints, through the Engine: greedy tokens (the
near-tie rule) and their logprobs to 1e-4 for one image and two images of different sizes (their
own grids), with chunked prefill cutting every image span (so DeepStack features are added to the
rows of a span cut across chunks); the same prompt again is served from the radix cache past its
images, with the same answer, the encoder not run again. The logprobs are what tells interleaved
M-RoPE from a sectioned one and DeepStack applied from left out (the tiny model's greedy tokens
alone might not)."""

import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.conftest import load_hf_qwen
from tests.vision.qwen3vl_checkpoint import write_tiny_qwen3vl
from tests.vision.test_qwen2vl_vs_hf import IMG, hf_reference
from tests.vision.test_qwen35vl_vs_hf import check_against_hf, generate

N = 16
CASES = [
    (f"<|im_start|>user\n{IMG}what is this?<|im_end|>\n<|im_start|>assistant\n", [(1, (40, 36))]),
    # 40x36: a grid of 4 rows of 5 tokens; 24x60: 8 rows of 3
    (f"user: {IMG} and {IMG} differ how?\nassistant:", [(2, (40, 36)), (3, (24, 60))]),
]
IDS = ["one", "two-sizes"]


@pytest.fixture(scope="module")
def dense(tiny_qwen3vl_dir, hf_qwen3vl):
    return tiny_qwen3vl_dir, hf_qwen3vl


@pytest.fixture(scope="module")
def engine(dense):
    # Chunks of 8 tokens: every image span (20, 24 tokens) is cut.
    with Engine(dense[0], **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        yield e


def _encoded(engine) -> int:
    return engine.get_internal_state()["mm_images_encoded"]


@pytest.mark.parametrize("text,images", CASES, ids=IDS)
def test_greedy_and_logprobs_match_hf_and_the_cache_serves_the_images(engine, dense, text, images):
    hf = dense[1]
    inputs, tokens, logprobs = hf_reference(hf, text, images, N)
    assert len({tuple(g) for g in inputs["image_grid_thw"].tolist()}) == len(images)
    ids = inputs["input_ids"][0].tolist()
    image = [i for i, t in enumerate(ids) if t == hf[0].config.image_token_id]
    engine.flush_cache()
    before = _encoded(engine)
    out = generate(engine, text, images, return_logprob=True, top_logprobs_num=5)
    check_against_hf(out, tokens, logprobs, "first")
    assert out["meta_info"]["cached_tokens"] == 0
    again = generate(engine, text, images, return_logprob=True)
    check_against_hf(again, tokens, logprobs, "again")
    assert again["output_ids"] == out["output_ids"]
    assert again["meta_info"]["cached_tokens"] > image[-1]  # past every image span
    assert _encoded(engine) - before == len(images)  # the second request encoded nothing


def test_text_alone_matches_hf(engine, dense):
    text = "<|im_start|>user\nwhat is a radix tree?<|im_end|>\n<|im_start|>assistant\n"
    _, tokens, logprobs = hf_reference(dense[1], text, [], N)
    check_against_hf(generate(engine, text, [], return_logprob=True), tokens, logprobs, "text")


def test_moe_matches_hf(tmp_path_factory, tokenizer_dir):
    """Qwen3-VL-MoE: its vision tower (Qwen3VLMoeVisionModel), experts stacked transposed on
    disk, a dense layer among the sparse ones."""
    path = write_tiny_qwen3vl(str(tmp_path_factory.mktemp("tiny-qwen3vl-moe")), tokenizer_dir, True)
    hf = load_hf_qwen(path, "Qwen3VLMoeForConditionalGeneration")
    text, images = CASES[1]
    _, tokens, logprobs = hf_reference(hf, text, images, N)
    with Engine(path, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        out = generate(e, text, images, return_logprob=True)
    check_against_hf(out, tokens, logprobs, "moe")
