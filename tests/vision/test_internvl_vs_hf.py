"""InternVL against HF transformers on a tiny random checkpoint (internvl_checkpoint.py), a Qwen2
decoder under a LayerNorm InternViT and a Qwen3 one under an RMSNorm + QK-norm InternViT:
greedy tokens and their logprobs to 1e-4 for text alone, one image (tiles + thumbnail), two images
of different tilings, each with chunked prefill cutting the tiles' runs and without; the same image
asked again served from the radix cache past its span; a malformed image refused naming the
field."""

import re

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import assert_matches_hf, hf_greedy
from tests.vision.conftest import data_url
from tests.vision.internvl_checkpoint import write_tiny_internvl

N = 24
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
IMG = "<IMG_CONTEXT>\n"


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def internvl_dir(request, tmp_path_factory, tokenizer_dir):
    out = str(tmp_path_factory.mktemp(f"tiny-internvl-{request.param}"))
    return write_tiny_internvl(out, tokenizer_dir, request.param)


@pytest.fixture(scope="module")
def hf(internvl_dir):
    """transformers' model and the processor radixlm loads (InternVLProcessor without its video
    processor, which needs torchvision)."""
    from transformers import InternVLForConditionalGeneration

    from radixlm.engine.hf_processors import load_hf_processor

    model = InternVLForConditionalGeneration.from_pretrained(internvl_dir, dtype=torch.float32)
    return model.eval(), load_hf_processor(internvl_dir)


@pytest.fixture(scope="module", params=[8, 512], ids=["chunked", "whole"])
def engine(request, internvl_dir):
    # chunks of 8 tokens: every tile's run (4 tokens between <img> and </img>) is cut somewhere
    chunk = request.param
    with Engine(
        internvl_dir, **engine_args(chunked_prefill_size=chunk, max_prefill_tokens=chunk)
    ) as e:
        yield e


def hf_reference(hf, text, images):
    return hf_greedy(hf, text, images, N)


CASES = [
    ("what is an image?", []),
    (IMG + "what is this?", [(1, (70, 40))]),  # 2x1 tiles + the thumbnail
    (IMG + "and " + IMG + "differ how?", [(2, (40, 36)), (3, (30, 90))]),  # 1 tile; 1x3 + thumb
]


@pytest.mark.parametrize("body,images", CASES, ids=["text", "one-image", "two-images"])
def test_greedy_and_logprobs_match_hf(engine, hf, body, images):
    text = PROMPT.format(body)
    tokens, logprobs = hf_reference(hf, text, images)
    out = engine.generate(
        text,
        {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
        image_data=[data_url(s, size) for s, size in images] or None,
        return_logprob=True,
        top_logprobs_num=5,
    )
    assert_matches_hf(out, tokens, logprobs)


def test_same_image_again_is_served_from_the_cache(engine):
    text = PROMPT.format(IMG + "what is this?")
    sp = {"max_new_tokens": 4, "temperature": 0}
    assert engine.flush_cache()
    first = engine.generate(text, sp, image_data=[data_url(5, (70, 40))])
    again = engine.generate(text, sp, image_data=[data_url(5, (70, 40))])
    other = engine.generate(text, sp, image_data=[data_url(6, (70, 40))])
    assert again["output_ids"] == first["output_ids"]
    prompt = first["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == prompt - 1  # past the image's span
    # the text before the first tile's run only
    assert other["meta_info"]["cached_tokens"] < 8


@pytest.mark.parametrize(
    "images,why",
    [
        (["data:image/png;base64,%%%notbase64"], "image_data[0]: not valid base64"),
        ([data_url(1), data_url(2)], "image_data: 2 image(s) given but the prompt has 1"),
    ],
    ids=["bad-base64", "count"],
)
def test_malformed_image_names_the_field(engine, images, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        engine.generate(PROMPT.format(IMG + "x"), {"max_new_tokens": 2}, image_data=images)
