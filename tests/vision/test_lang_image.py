"""sgl.image(path) in a program (SGLang's frontend): the image token in the text, the image sent
as image_data; the answer is HF's for that image, and a fork's branches each see it."""

import io

import pytest
import torch

import radixlm.lang as sgl
from tests.conftest import engine_args
from tests.vision.checkpoints import png_bytes

N = 12


@pytest.fixture(scope="module")
def backend(tiny_llava_dir):
    be = sgl.EngineBackend(tiny_llava_dir, **engine_args())
    yield be
    be.shutdown()


def hf_text(hf, text, seed):
    from PIL import Image

    model, proc = hf
    inputs = proc(
        text=text,
        images=[Image.open(io.BytesIO(png_bytes(seed))).convert("RGB")],
        return_tensors="pt",
    )
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return proc.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


@sgl.function
def describe(s, path):
    s += "user: " + sgl.image(path) + " what is this?\nassistant:"
    s += sgl.gen("answer", max_tokens=N, temperature=0, ignore_eos=True)


@sgl.function
def two_views(s, path):
    s += "user: " + sgl.image(path) + " what is this?\nassistant:"
    forks = s.fork(2)
    for f, q in zip(forks, [" It is", " I see"]):
        f += q + sgl.gen("more", max_tokens=N, temperature=0, ignore_eos=True)
    return forks[0]["more"], forks[1]["more"]


@pytest.mark.parametrize("seed", [1, 2])
def test_image_in_a_program_answers_as_hf(backend, hf_llava, tmp_path, seed):
    path = tmp_path / f"img{seed}.png"
    path.write_bytes(png_bytes(seed))
    state = describe.run(path=str(path), backend=backend)
    assert state["answer"] == hf_text(hf_llava, "user: <image> what is this?\nassistant:", seed)


def test_fork_branches_keep_the_image(backend, hf_llava, tmp_path):
    path = tmp_path / "img.png"
    path.write_bytes(png_bytes(3))
    a, b = two_views.run(path=str(path), backend=backend).ret_value
    base = "user: <image> what is this?\nassistant:"
    assert a == hf_text(hf_llava, base + " It is", 3)
    assert b == hf_text(hf_llava, base + " I see", 3)


def test_qwen2vl_program_writes_the_vision_markers(tiny_qwen2vl_dir, hf_qwen2vl, tmp_path):
    """For Qwen2-VL, image() writes <|vision_start|><|image_pad|><|vision_end|> (its chat template's
    image) and the answer is HF's for that text."""
    path = tmp_path / "img.png"
    path.write_bytes(png_bytes(4))
    be = sgl.EngineBackend(tiny_qwen2vl_dir, **engine_args())
    try:
        assert be.image_token == "<|vision_start|><|image_pad|><|vision_end|>"
        state = describe.run(path=str(path), backend=be)
    finally:
        be.shutdown()
    text = f"user: {be.image_token} what is this?\nassistant:"
    assert state["answer"] == hf_text(hf_qwen2vl, text, 4)
