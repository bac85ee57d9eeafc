"""Qwen2-VL through the server and the OpenAI client (as test_vision_server.py does for LLaVA): the
image span cached by content (cached_tokens, the encoder run once), the hit stopping at a different
image's first token, images of different sizes kept in order, /v1/models, and the same hostile
images refused (a 400 naming the field, a 413 for a 100 MB body) while the server goes on."""

import openai
import pytest
import requests

from tests.vision.conftest import data_url
from tests.vision.test_qwen2vl_vs_hf import IMG, hf_reference
from tests.vision.test_vision_server import (  # noqa: F401 (fixtures, and a test run here on Qwen2-VL)
    HOSTILE,
    chat,
    client,
    encoder,
    image_host,
    messages,
    test_slow_url_times_out_and_100mb_body_is_refused,
    vision_server,
)

N = 16
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
SIZE = (40, 36)  # a 4 x 5 grid: 20 tokens


@pytest.fixture(scope="module")
def server(tiny_qwen2vl_dir):
    s = vision_server(tiny_qwen2vl_dir)
    yield s
    s.stop()


def rendered(hf, n_images: int, text: str) -> str:
    """The chat template's text for n images then text, as the server renders it."""
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": text}]
    return hf[1].apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def hf_answer(hf, text, images):
    """HF's greedy tokens and the index of the first image token and of the end of the last
    image."""
    inputs, tokens, _ = hf_reference(hf, text, images, N)
    ids = inputs["input_ids"][0].tolist()
    image = [i for i, t in enumerate(ids) if t == hf[0].config.image_token_id]
    return tokens, image[0], image[-1] + 1


def test_models_list_says_image(client):
    assert client.models.list().data[0].model_extra["modalities"] == ["text", "image"]


def test_same_image_twice_is_cached_and_encoded_once(server, client, hf_qwen2vl):
    requests.post(server.url + "/flush_cache", timeout=30)
    text = "describe this picture in detail"
    msgs = messages(data_url(11, SIZE), text)
    before = encoder(server)
    first, second = chat(client, msgs), chat(client, msgs)
    after = encoder(server)
    ref, first_image, span_end = hf_answer(hf_qwen2vl, rendered(hf_qwen2vl, 1, text), [(11, SIZE)])
    assert span_end - first_image == 20
    assert first.usage.prompt_tokens_details.cached_tokens <= first_image
    assert (
        second.usage.prompt_tokens_details.cached_tokens >= span_end
    )  # the whole image span came from the cache
    assert (
        after["mm_images_encoded"] - before["mm_images_encoded"] == 1
    )  # chunks of 8 and the second ask: one encode
    assert (
        first.choices[0].model_extra["token_ids"]
        == ref
        == second.choices[0].model_extra["token_ids"]
    )


def test_other_image_same_text_hits_up_to_the_image(server, client, hf_qwen2vl):
    text = "what is in this image?"
    chat(client, messages(data_url(21, SIZE), text))
    before = encoder(server)
    other = chat(client, messages(data_url(22, SIZE), text))
    ref, first_image, _ = hf_answer(hf_qwen2vl, rendered(hf_qwen2vl, 1, text), [(22, SIZE)])
    assert (
        other.usage.prompt_tokens_details.cached_tokens == first_image
    )  # the hit stops at the image's first token
    assert encoder(server)["mm_images_encoded"] - before["mm_images_encoded"] == 1
    assert (
        other.choices[0].model_extra["token_ids"] == ref
    )  # the other image's answer (HF's), not the cached one's
    native = requests.post(
        server.url + "/generate",
        timeout=120,
        json={
            "text": rendered(hf_qwen2vl, 1, text),
            "image_data": data_url(22, SIZE),
            "sampling_params": SP,
        },
    )
    assert native.status_code == 200, native.text
    assert native.json()["output_ids"] == ref


def test_two_images_of_different_sizes_keep_their_order(server, client, hf_qwen2vl):
    text = "which is brighter?"
    for images in ([(31, SIZE), (32, (24, 60))], [(32, (24, 60)), (31, SIZE)]):
        out = chat(client, messages(*[data_url(s, size) for s, size in images], text))
        assert (
            out.choices[0].model_extra["token_ids"]
            == hf_answer(hf_qwen2vl, rendered(hf_qwen2vl, 2, text), images)[0]
        )


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
    """Qwen2-VL's resize refuses an aspect ratio past 200: a 400, and the server goes on."""
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


def test_a_url_from_an_allowed_host(server, client, image_host):
    via_url = chat(client, messages(image_host + "/img.png", "and this one?"))
    via_data = chat(client, messages(data_url(7), "and this one?"))  # the host serves png_bytes(7)
    assert (
        via_url.choices[0].model_extra["token_ids"] == via_data.choices[0].model_extra["token_ids"]
    )
