"""LLaVA against HF transformers on a tiny random checkpoint (2-layer CLIP at 32 px): the greedy
tokens and their logprobs (the logits' log-softmax) to 1e-4, one image and several, alone, batched
and with chunked prefill cutting through the image spans."""

import io

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import png_bytes
from tests.vision.conftest import data_url

N = 32


@pytest.fixture(scope="module")
def engine(tiny_llava_dir):
    # Chunks of 8 tokens: every image span (16 tokens) is cut in the middle.
    with Engine(tiny_llava_dir, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        yield e


def hf_reference(hf_llava, text, seeds):
    """HF's greedy tokens and, per step, the log-softmax of its logits."""
    from PIL import Image

    model, proc = hf_llava
    images = [Image.open(io.BytesIO(png_bytes(s))).convert("RGB") for s in seeds]
    inputs = proc(text=text, images=images, return_tensors="pt")
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
    tokens = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    logprobs = [torch.log_softmax(s[0].float(), -1) for s in out.scores]
    return tokens, logprobs


def check(out, tokens, logprobs):
    assert out["output_ids"] == tokens
    got = out["meta_info"]["output_token_logprobs"]
    tops = out["meta_info"]["output_top_logprobs"]
    for step, ((lp, tid, _), top) in enumerate(zip(got, tops)):
        assert abs(lp - logprobs[step][tid].item()) < 1e-4, step
        for lp_k, tid_k, _ in top:
            assert abs(lp_k - logprobs[step][tid_k].item()) < 1e-4, step


CASES = [
    ("user: <image> what is this?\nassistant:", [1]),
    ("user: <image> and <image> differ how?\nassistant:", [2, 3]),
    (
        "user: compare <image><image><image>\nassistant:",
        [4, 5, 6],
    ),  # side by side: one run of placeholders
]


@pytest.mark.parametrize("text,seeds", CASES)
def test_greedy_and_logprobs_match_hf(engine, hf_llava, text, seeds):
    tokens, logprobs = hf_reference(hf_llava, text, seeds)
    sp = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
    out = engine.generate(
        text, sp, image_data=[data_url(s) for s in seeds], return_logprob=True, top_logprobs_num=5
    )
    check(out, tokens, logprobs)


def test_batch_of_image_requests_matches_hf(engine, hf_llava):
    refs = [hf_reference(hf_llava, t, s)[0] for t, s in CASES]
    sp = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
    outs = engine.generate(
        [t for t, _ in CASES], sp, image_data=[[data_url(x) for x in s] for _, s in CASES]
    )
    assert [o["output_ids"] for o in outs] == refs


def test_image_order_matters(engine, hf_llava):
    """The same two images swapped give HF's answer for that order (the spans are not mixed up)."""
    text = CASES[1][0]
    sp = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
    for seeds in ([2, 3], [3, 2]):
        out = engine.generate(text, sp, image_data=[data_url(s) for s in seeds])
        assert out["output_ids"] == hf_reference(hf_llava, text, seeds)[0]
