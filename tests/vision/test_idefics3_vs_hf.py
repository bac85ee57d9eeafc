"""Idefics3 and SmolVLM (Idefics3's architecture under transformers' SmolVLM classes and
processor) against HF transformers on a tiny random checkpoint of each: images split into tiles
plus the whole image (each tile its own placeholder run and cache item), greedy tokens and their
logprobs to 1e-4, one image and two, chunked prefill cutting the runs; the same image asked again
served from the radix cache past its span, a different one not."""

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import assert_matches_hf, hf_greedy, write_tiny_idefics3
from tests.vision.conftest import data_url

N = 32


@pytest.fixture(scope="module", params=["Idefics3", "SmolVLM"])
def idefics3_dir(request, tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    tok_dir = tmp_path_factory.mktemp("tok")
    load_tokenizer(default_model_path).save_pretrained(tok_dir)
    out = str(tmp_path_factory.mktemp(f"tiny-{request.param.lower()}"))
    return write_tiny_idefics3(out, str(tok_dir), request.param)


@pytest.fixture(scope="module")
def hf(idefics3_dir):
    """transformers' model of the checkpoint's class, and the processor radixlm loads (the same
    transformers processor; SmolVLM's without its video part, which needs torchvision)."""
    import transformers

    from radixlm.engine.hf_processors import load_hf_processor

    arch = transformers.AutoConfig.from_pretrained(idefics3_dir).architectures[0]
    model = getattr(transformers, arch).from_pretrained(idefics3_dir, dtype=torch.float32)
    return model.eval(), load_hf_processor(idefics3_dir)


@pytest.fixture(scope="module")
def engine(idefics3_dir):
    with Engine(idefics3_dir, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        yield e


@pytest.mark.parametrize(
    "text,seeds,size",
    [
        ("User: <image> what is this?\nAssistant:", [1], (50, 40)),  # 2x2 tiles + the whole image
        (
            "User: <image> and <image>?\nAssistant:",
            [2, 3],
            (30, 60),
        ),  # a tall one: 2x1 tiles (padded) + whole
    ],
)
def test_greedy_and_logprobs_match_hf(engine, hf, text, seeds, size):
    tokens, logprobs = hf_greedy(hf, text, [(s, size) for s in seeds], N, one_sample=True)
    out = engine.generate(
        text,
        {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
        image_data=[data_url(s, size) for s in seeds],
        return_logprob=True,
        top_logprobs_num=5,
    )
    assert_matches_hf(out, tokens, logprobs)


def test_same_image_again_is_served_from_the_cache(engine):
    text = "User: <image> what is this?\nAssistant:"
    sp = {"max_new_tokens": 4, "temperature": 0}
    assert engine.flush_cache()
    first = engine.generate(text, sp, image_data=[data_url(5, (50, 40))])
    again = engine.generate(text, sp, image_data=[data_url(5, (50, 40))])
    other = engine.generate(text, sp, image_data=[data_url(6, (50, 40))])
    assert again["output_ids"] == first["output_ids"]
    prompt = first["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == prompt - 1  # past the image's span
    # the text before the image only ("User: " and the image's opening tokens)
    assert other["meta_info"]["cached_tokens"] < 8
