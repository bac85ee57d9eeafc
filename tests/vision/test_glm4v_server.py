"""GLM-4.1V (Glm4vForConditionalGeneration, models/glm4v.py) with images through the server and the
OpenAI client (image_url data URIs): HF's greedy tokens for text alone, one image and two images of
different sizes in one chat (the chat template's <|begin_of_image|><|image|><|end_of_image|>,
expanded by Glm4vProcessor); the radix cache keyed by image content: the same image asked again is
served from the cache past its span (cached_tokens covers it, the encoder runs once), a different
image after the same text is not; hostile images and one the processor refuses are 400s naming
the field, and the server goes on."""

import openai
import pytest
import requests

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.vision.conftest import data_url
from tests.vision.glm4v_checkpoint import IMG
from tests.vision.test_qwen35vl_server import answer, ask, hf_answer
from tests.vision.test_vision_server import (  # noqa: F401 (fixtures)
    HOSTILE,
    chat,
    client,
    encoder,
    image_host,
    messages,
    vision_server,
)

SIZE, TALL = (40, 36), (24, 60)  # grids of 4 x 5 and 8 x 3 tokens
SP = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_glm4v_dir):
    s = vision_server(tiny_glm4v_dir)
    yield s
    s.stop()


@pytest.mark.parametrize(
    "parts",
    [
        ["hi"],
        [(41, SIZE), "what do you see?"],
        ["which is brighter,", (42, SIZE), "or", (43, TALL)],
    ],
    ids=["text-only", "one", "two-sizes"],
)
def test_chat_matches_hf(client, hf_glm4v, parts):
    ref, _, _ = hf_answer(hf_glm4v, parts)
    assert_greedy_equal(answer(ask(client, parts)), ref, str(parts))
    assert client.models.list().data[0].model_extra["modalities"] == ["text", "image"]


def test_same_image_is_served_from_the_cache_a_different_one_is_not(server, client, hf_glm4v):
    requests.post(server.url + "/flush_cache", timeout=30)
    one = ["please look closely at the picture below:", (1, SIZE), "what is this?"]
    other = [one[0], (2, SIZE), one[2]]
    ref1, first_image, span_end = hf_answer(hf_glm4v, one)
    ref2, _, _ = hf_answer(hf_glm4v, other)
    assert span_end - first_image == 20
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


@pytest.mark.parametrize(
    "make,why", HOSTILE, ids=["bomb", "truncated", "too-big", "domain", "bad-base64"]
)
def test_hostile_images_are_400s_naming_the_field(server, client, make, why):
    url = make()
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages("look:", url))
    assert why in e.value.message and e.value.param == "messages[0].content[1].image_url.url"
    r = requests.post(
        server.url + "/generate",
        timeout=60,
        json={"text": f"{IMG} x", "image_data": [url], "sampling_params": SP},
    )
    assert r.status_code == 400 and why in r.text and "image_data[0]" in r.text
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert chat(client, messages(data_url(1, SIZE), "still there?")).choices[0].message.content


def test_an_image_the_processor_refuses_is_a_400(server, client):
    """GLM-4V's resize refuses an aspect ratio past 200: a 400, and the server goes on."""
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages(data_url(5, (600, 2)), "x"))
    assert "aspect ratio must be smaller than 200" in e.value.message
    r = requests.post(
        server.url + "/generate",
        timeout=60,
        json={"text": f"{IMG} x", "image_data": data_url(5, (600, 2)), "sampling_params": SP},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("image_data: ")
    assert chat(client, messages(data_url(1, SIZE), "still there?")).choices[0].message.content
