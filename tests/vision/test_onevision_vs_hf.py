"""LLaVA-OneVision against HF transformers on a tiny random checkpoint (onevision_checkpoint.py):
greedy tokens and their logprobs to 1e-4 for text alone, one image (the whole image + its anyres
grid, unpadded, shrunk past anyres_max_2, rows closed by image_newline) of several shapes, two
images (each whole, as HF lays out a prompt's several images), with chunked prefill cutting the
spans and without; the same image asked again served from the radix cache past its span; a
malformed image refused naming the field."""

import re

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import assert_matches_hf, hf_greedy
from tests.vision.conftest import data_url
from tests.vision.onevision_checkpoint import write_tiny_onevision

N = 24
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
IMG = "<image>\n"


@pytest.fixture(scope="module")
def onevision_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_onevision(str(tmp_path_factory.mktemp("tiny-onevision")), tokenizer_dir)


@pytest.fixture(scope="module")
def hf(onevision_dir):
    """transformers' model and the processor radixlm loads (LlavaOnevisionProcessor without its
    video processor, which needs torchvision)."""
    from transformers import LlavaOnevisionForConditionalGeneration

    from radixlm.engine.hf_processors import load_hf_processor

    model = LlavaOnevisionForConditionalGeneration.from_pretrained(
        onevision_dir, dtype=torch.float32
    )
    return model.eval(), load_hf_processor(onevision_dir)


@pytest.fixture(scope="module", params=[8, 512], ids=["chunked", "whole"])
def engine(request, onevision_dir):
    chunk = request.param  # 8: every image span (30+ tokens) is cut several times
    with Engine(
        onevision_dir, **engine_args(chunked_prefill_size=chunk, max_prefill_tokens=chunk)
    ) as e:
        yield e


def hf_reference(hf, text, images):
    return hf_greedy(hf, text, images, N, one_sample=True)


CASES = [
    ("what is an image?", []),
    (IMG + "what is this?", [(1, (40, 36))]),  # a 2x2 grid, shrunk (anyres_max_2)
    (IMG + "what is this?", [(4, (70, 40))]),  # a wide one: unpadded rows
    (IMG + "what is this?", [(7, (30, 90))]),  # a 3x1 grid, unpadded columns
    (IMG + "and " + IMG + "differ how?", [(2, (40, 36)), (3, (70, 40))]),
]


@pytest.mark.parametrize(
    "body,images", CASES, ids=["text", "one-image", "wide", "tall", "two-images"]
)
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
    assert other["meta_info"]["cached_tokens"] < 8  # the text before the image only


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
