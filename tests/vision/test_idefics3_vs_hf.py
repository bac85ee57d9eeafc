"""Idefics3 / SmolVLM's architecture against HF transformers on a tiny random checkpoint: images
split into tiles plus the whole image (each tile its own placeholder run and cache item), greedy
tokens and their logprobs to 1e-4, one image and two, chunked prefill cutting the runs."""

import io

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import png_bytes, write_tiny_idefics3
from tests.vision.conftest import data_url

N = 32


@pytest.fixture(scope="module")
def idefics3_dir(tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    tok_dir = tmp_path_factory.mktemp("tok")
    load_tokenizer(default_model_path).save_pretrained(tok_dir)
    return write_tiny_idefics3(str(tmp_path_factory.mktemp("tiny-idefics3")), str(tok_dir))


@pytest.fixture(scope="module")
def hf(idefics3_dir):
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    return (
        Idefics3ForConditionalGeneration.from_pretrained(idefics3_dir, dtype=torch.float32).eval(),
        AutoProcessor.from_pretrained(idefics3_dir),
    )


@pytest.fixture(scope="module")
def engine(idefics3_dir):
    with Engine(idefics3_dir, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        yield e


def hf_reference(hf, text, seeds, size):
    from PIL import Image

    model, proc = hf
    images = [Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s in seeds]
    inputs = proc(text=text, images=[images], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=N,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out.sequences[0, inputs["input_ids"].shape[1] :].tolist(), [
        torch.log_softmax(s[0].float(), -1) for s in out.scores
    ]


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
    tokens, logprobs = hf_reference(hf, text, seeds, size)
    out = engine.generate(
        text,
        {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
        image_data=[data_url(s, size) for s in seeds],
        return_logprob=True,
        top_logprobs_num=5,
    )
    assert out["output_ids"] == tokens
    for step, ((lp, tid, _), top) in enumerate(
        zip(out["meta_info"]["output_token_logprobs"], out["meta_info"]["output_top_logprobs"])
    ):
        assert abs(lp - logprobs[step][tid].item()) < 1e-4, step
        for lp_k, tid_k, _ in top:
            assert abs(lp_k - logprobs[step][tid_k].item()) < 1e-4, step
