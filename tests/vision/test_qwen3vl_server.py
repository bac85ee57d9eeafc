"""Qwen3-VL with images through the server and the OpenAI client (image_url data URIs): HF's
greedy tokens for two images of different sizes in one chat; the radix cache keyed by image
content: the same image asked again is served from the cache past its span (cached_tokens covers
it, the encoder runs once: the DeepStack features come from the encoder cache with the
embedding), and a different image after the same text is not."""

import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.vision.test_qwen35vl_server import answer, ask, hf_answer
from tests.vision.test_vision_server import client, encoder  # noqa: F401 (fixture)

SIZE, TALL = (40, 36), (24, 60)  # grids of 4 x 5 and 8 x 3 tokens


@pytest.fixture(scope="module")
def server(tiny_qwen3vl_dir):
    s = ServerProcess(
        "--model-path",
        tiny_qwen3vl_dir,
        "--kv-memory-gb",
        "0.05",
        "--num-threads",
        "1",
        "--enable-invariant-checks",
        "--chunked-prefill-size",
        "8",
    )
    yield s
    s.stop()


def test_two_images_match_hf(client, hf_qwen3vl):
    parts = ["which is brighter,", (42, SIZE), "or", (43, TALL)]
    ref, _, _ = hf_answer(hf_qwen3vl, parts)
    assert_greedy_equal(answer(ask(client, parts)), ref, "two images")
    assert client.models.list().data[0].model_extra["modalities"] == ["text", "image"]


def test_same_image_is_served_from_the_cache_a_different_one_is_not(server, client, hf_qwen3vl):
    requests.post(server.url + "/flush_cache", timeout=30)
    one = ["please look closely at the picture below:", (1, SIZE), "what is this?"]
    other = [one[0], (2, SIZE), one[2]]
    ref1, first_image, span_end = hf_answer(hf_qwen3vl, one)
    ref2, _, _ = hf_answer(hf_qwen3vl, other)
    assert ref1[1] != ref2[1], "the two images were meant to give different answers"
    before = encoder(server)
    first, second = ask(client, one), ask(client, one)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= span_end
    assert encoder(server)["mm_images_encoded"] - before["mm_images_encoded"] == 1
    assert_greedy_equal(answer(first), ref1, "first")
    assert answer(second) == answer(first)
    out = ask(client, other)
    # the radix cache matches up to the image's first pad value: its span is keyed by content
    assert out.usage.prompt_tokens_details.cached_tokens <= first_image
    assert_greedy_equal(answer(out), ref2, "other image")
