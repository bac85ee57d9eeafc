"""Qwen2-VL (and Qwen2.5-VL) against HF transformers on tiny random checkpoints
(model/executor/mrope.py's M-RoPE, dynamic resolution: images of different sizes have different
grids): greedy tokens and their logprobs to 1e-4, one image and several, in a batch, with chunked
prefill cutting every image span, after radix-cache hits (the whole image, and generated tokens of
an earlier turn), through retraction, and through speculative verification."""

import io

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import png_bytes, write_tiny_qwen2vl
from tests.vision.conftest import data_url, load_hf_qwen

N = 32
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
# (seed, (width, height)): 8 px per decoder token, sides rounded to 8 px: 40x36 is a grid of 4 rows
# of 5 tokens, 24x60 8 rows of 3, 17x30 4 of 2; 80x72 is past max_pixels (64x64): resized to 7 rows
# of 8.
CASES = [
    (f"<|im_start|>user\n{IMG}what is this?<|im_end|>\n<|im_start|>assistant\n", [(1, (40, 36))]),
    (f"user: {IMG} and {IMG} differ how?\nassistant:", [(2, (40, 36)), (3, (24, 60))]),
    (f"{IMG}{IMG} then {IMG}.", [(4, (80, 72)), (5, (17, 30)), (6, (90, 20))]),  # an image first
]


@pytest.fixture(scope="module")
def engine(tiny_qwen2vl_dir):
    # Chunks of 8 tokens: every image span (8 to 56 tokens) is cut, most of them more than once.
    with Engine(tiny_qwen2vl_dir, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        yield e


def hf_reference(hf, text, images, n=N):
    """HF's processor inputs, its greedy tokens and, per step, the log-softmax of its logits."""
    from PIL import Image

    model, proc = hf
    pil = [Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s, size in images]
    inputs = proc(text=text, images=pil or None, return_tensors="pt")  # none: text alone
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=n,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    tokens = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    return inputs, tokens, [torch.log_softmax(s[0].double(), -1) for s in out.scores]


def urls(images):
    return [data_url(s, size) for s, size in images]


def check_logprobs(out, logprobs):
    meta = out["meta_info"]
    for step, ((lp, tid, _), top) in enumerate(
        zip(meta["output_token_logprobs"], meta["output_top_logprobs"])
    ):
        assert abs(lp - logprobs[step][tid].item()) < 1e-4, step
        for lp_k, tid_k, _ in top:
            assert abs(lp_k - logprobs[step][tid_k].item()) < 1e-4, step


@pytest.mark.parametrize("text,images", CASES, ids=["one", "two-sizes", "three-adjacent"])
def test_greedy_and_logprobs_match_hf(engine, hf_qwen2vl, text, images):
    inputs, tokens, logprobs = hf_reference(hf_qwen2vl, text, images)
    assert len({tuple(g) for g in inputs["image_grid_thw"].tolist()}) == len(
        images
    )  # the grids differ
    out = engine.generate(
        text, SP, image_data=urls(images), return_logprob=True, top_logprobs_num=5
    )
    assert out["output_ids"] == tokens
    check_logprobs(out, logprobs)


def test_batch_matches_hf(engine, hf_qwen2vl):
    refs = [hf_reference(hf_qwen2vl, t, imgs)[1] for t, imgs in CASES]
    outs = engine.generate([t for t, _ in CASES], SP, image_data=[urls(imgs) for _, imgs in CASES])
    assert [o["output_ids"] for o in outs] == refs


def test_cache_hits_keep_the_positions(engine, hf_qwen2vl):
    """The same prompt again hits past its images; a next turn that repeats the first turn's answer
    hits into the generated tokens (their K/V written at index + delta): both give HF's answer for
    the whole prompt."""
    engine.flush_cache()
    text, images = CASES[1]
    inputs, tokens, _ = hf_reference(hf_qwen2vl, text, images)
    first = engine.generate(text, SP, image_data=urls(images))
    again = engine.generate(text, SP, image_data=urls(images))
    last_image = max(
        i
        for i, t in enumerate(inputs["input_ids"][0].tolist())
        if t == hf_qwen2vl[0].config.image_token_id
    )
    assert first["output_ids"] == again["output_ids"] == tokens
    assert again["meta_info"]["cached_tokens"] > last_image
    turn2 = text + hf_qwen2vl[1].tokenizer.decode(tokens) + "\nuser: and now?\nassistant:"
    inputs2, tokens2, _ = hf_reference(hf_qwen2vl, turn2, images)
    out = engine.generate(turn2, SP, image_data=urls(images))
    assert (
        out["meta_info"]["cached_tokens"] > inputs["input_ids"].shape[1] + 4
    )  # into the first answer
    assert out["output_ids"] == tokens2


def test_retraction_and_speculative_verify_keep_the_positions(tiny_qwen2vl_dir, hf_qwen2vl):
    """A pool too small for the batch retracts requests (their answers so far prefilled again after
    the images; prefill chunks ride with decode steps: mixed batches); radix drafts of an answer
    asked again are verified as an extend after the prompt."""
    refs = [hf_reference(hf_qwen2vl, t, imgs)[1] for t, imgs in CASES]
    small_pool = engine_args(max_total_tokens=260, chunked_prefill_size=32, enable_mixed_chunk=True)
    with Engine(tiny_qwen2vl_dir, **small_pool) as small:
        outs = small.generate(
            [t for t, _ in CASES] * 2, SP, image_data=[urls(imgs) for _, imgs in CASES] * 2
        )
        state = small.get_internal_state()
    assert state["num_retracted"] > 0, "the pool was meant to be too small for all requests"
    assert state["mixed_steps"] > 0
    assert [o["output_ids"] for o in outs] == refs * 2
    spec = engine_args(
        speculative_algorithm="radix",
        speculative_num_draft_tokens=5,
        speculative_draft_policy="fixed",
    )
    with Engine(tiny_qwen2vl_dir, **spec) as e:
        text, images = CASES[0]
        e.generate(text, SP, image_data=urls(images))
        out = e.generate(text, {**SP, "max_new_tokens": N + 8}, image_data=urls(images))
    assert out["meta_info"]["spec_accepted_tokens"] > 0
    assert out["output_ids"] == hf_reference(hf_qwen2vl, text, images, N + 8)[1]


def test_qwen2_5_vl_matches_hf(tmp_path_factory, tokenizer_dir):
    """Qwen2.5-VL: the same decoder and positions, a ViT with window attention in all blocks but
    one."""
    path = write_tiny_qwen2vl(
        str(tmp_path_factory.mktemp("tiny-qwen2.5vl")), tokenizer_dir, v2_5=True
    )
    ref = load_hf_qwen(path, "Qwen2_5_VLForConditionalGeneration")
    text, images = CASES[2]
    _, tokens, logprobs = hf_reference(ref, text, images)
    with Engine(path, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        out = e.generate(text, SP, image_data=urls(images), return_logprob=True, top_logprobs_num=5)
    assert out["output_ids"] == tokens
    check_logprobs(out, logprobs)
