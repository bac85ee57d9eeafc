"""Qwen3.5 with images through the server and the OpenAI client (image_url data URIs): HF's greedy
tokens for one image, two of different sizes and text alone; the hybrid prefix cache keyed by image
content: the same image asked again resumes from a state snapshot past the image (cached_tokens
covers it, the encoder runs once), a different image after the same text resumes from the last
snapshot before the image and never from one after it (snapshots every 8 tokens here: some lie
inside and after the first image's span)."""

import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.vision.conftest import data_url
from tests.vision.test_qwen2vl_vs_hf import hf_reference
from tests.vision.test_vision_server import chat, client, encoder, messages  # noqa: F401 (fixture)

N = 16  # test_vision_server.chat's max_tokens
INTERVAL = 8  # --mamba-track-interval: a snapshot every 8 prompt tokens
SIZE, TALL = (40, 36), (24, 60)  # grids of 4 x 5 and 8 x 3 tokens


@pytest.fixture(scope="module")
def server(tiny_qwen35vl_dir):
    s = ServerProcess(
        "--model-path",
        tiny_qwen35vl_dir,
        "--kv-memory-gb",
        "0.05",
        "--num-threads",
        "1",
        "--enable-invariant-checks",
        "--chunked-prefill-size",
        "8",
        "--mamba-track-interval",
        str(INTERVAL),
    )
    yield s
    s.stop()


def hf_answer(hf, parts: list):
    """parts: texts and (seed, size) images, in order. HF's ids, greedy tokens and logprobs for the
    chat of one user message of them (the chat template's text, as the server renders it), the
    index of the first image token and the end of the last image's span."""
    content = [
        {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts
    ]
    text = hf[1].apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    images = [p for p in parts if not isinstance(p, str)]
    inputs, tokens, logprobs = hf_reference(hf, text, images, N)
    ids = inputs["input_ids"][0].tolist()
    image = [i for i, t in enumerate(ids) if t == hf[0].config.image_token_id] or [len(ids)]
    return (ids, tokens, logprobs), image[0], image[-1] + 1


def ask(client, parts: list):
    return chat(client, messages(*[p if isinstance(p, str) else data_url(*p) for p in parts]))


def answer(out) -> list[int]:
    return out.choices[0].model_extra["token_ids"]


@pytest.mark.parametrize(
    "parts",
    [
        [(41, SIZE), "what do you see?"],
        ["which is brighter,", (42, SIZE), "or", (43, TALL)],
        ["hi"],
    ],
    ids=["one", "two-sizes", "text-only"],
)
def test_chat_matches_hf(client, hf_qwen35vl, parts):
    ref, _, _ = hf_answer(hf_qwen35vl, parts)
    assert_greedy_equal(answer(ask(client, parts)), ref, str(parts))
    assert client.models.list().data[0].model_extra["modalities"] == ["text", "image"]


def test_same_image_is_cached_a_different_one_is_not(server, client, hf_qwen35vl):
    requests.post(server.url + "/flush_cache", timeout=30)
    one = ["please look closely at the picture below:", (1, SIZE), "what is this?"]
    other = [one[0], (2, SIZE), one[2]]
    ref1, first_image, span_end = hf_answer(hf_qwen35vl, one)
    ref2, _, _ = hf_answer(hf_qwen35vl, other)
    assert ref1[1] != ref2[1], "the two images were meant to give different answers"
    assert first_image >= INTERVAL  # a snapshot lies before the image
    before = encoder(server)
    first, second = ask(client, one), ask(client, one)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == len(ref1[0]) - 1 >= span_end
    assert encoder(server)["mm_images_encoded"] - before["mm_images_encoded"] == 1
    assert_greedy_equal(answer(first), ref1, "first")
    assert answer(second) == answer(first)
    out = ask(client, other)
    # the last snapshot before the image's first token; the ones inside and after its span
    # belong to the first image
    cached = out.usage.prompt_tokens_details.cached_tokens
    assert first_image - INTERVAL < cached <= first_image
    assert_greedy_equal(answer(out), ref2, "other image")
