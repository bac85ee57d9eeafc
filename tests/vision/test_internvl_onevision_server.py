"""InternVL, LLaVA-OneVision, Kimi-K2.5 and LFM2-VL through the server and the OpenAI client
(chunks of 8 tokens): chat messages with one image and two, laid out by the processor's chat
template, give HF's greedy tokens; the same image asked again is encoded once and comes from the
cache; a malformed image is a 400 naming its field, and the server keeps serving; a video is a
400."""

from __future__ import annotations

import io

import openai
import pytest
import requests
import torch

from tests.vision.checkpoints import png_bytes
from tests.vision.conftest import data_url
from tests.vision.internvl_checkpoint import write_tiny_internvl
from tests.vision.kimi_k25_checkpoint import write_tiny_kimi_k25
from tests.vision.lfm2vl_checkpoint import write_tiny_lfm2vl
from tests.vision.onevision_checkpoint import write_tiny_onevision
from tests.vision.test_vision_server import N, chat, client, encoder, messages, vision_server  # noqa: F401

# name -> (writer, HF class, whether HF's processor takes a prompt's images as one sample, the
# items a 64 x 64 image makes: InternVL's and LFM2-VL's 2x2 tiles + the thumbnail)
FAMILIES = {
    "internvl": (write_tiny_internvl, "InternVLForConditionalGeneration", False, 5),
    "onevision": (write_tiny_onevision, "LlavaOnevisionForConditionalGeneration", True, 1),
    "kimi_k25": (write_tiny_kimi_k25, "Kimi_K25ForConditionalGeneration", False, 1),
    "lfm2vl": (write_tiny_lfm2vl, "Lfm2VlForConditionalGeneration", False, 5),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, tokenizer_dir):
    import transformers

    from radixlm.engine.hf_processors import load_hf_processor

    write, arch, nested, items = FAMILIES[request.param]
    path = write(str(tmp_path_factory.mktemp(request.param)), tokenizer_dir)
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32).eval()
    return path, (model, load_hf_processor(path), nested), items


@pytest.fixture(scope="module")
def server(family):
    s = vision_server(family[0])
    yield s
    s.stop()


def hf_tokens(hf, images: list, text: str) -> list[int]:
    from PIL import Image

    model, proc, nested = hf
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]
    prompt = proc.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    pics = [Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s, size in images]
    inputs = proc(text=prompt, images=[pics] if nested else pics, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_chat_with_images_matches_hf(family, server, client):
    _, hf, _ = family
    for images in ([(1, (70, 40))], [(2, (40, 36)), (3, (30, 90))]):
        out = chat(client, messages(*[data_url(s, size) for s, size in images], "what is it?"))
        assert out.choices[0].model_extra["token_ids"] == hf_tokens(hf, images, "what is it?")


def test_repeated_image_is_encoded_once(family, server, client):
    requests.post(server.url + "/flush_cache", timeout=30)
    msgs = messages(data_url(11, (64, 64)), "describe it")
    before = encoder(server)
    first, second = chat(client, msgs), chat(client, msgs)
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert encoder(server)["mm_images_encoded"] - before["mm_images_encoded"] == family[2]
    assert first.choices[0].model_extra["token_ids"] == second.choices[0].model_extra["token_ids"]


def test_malformed_image_is_a_400_naming_the_field(family, server, client):
    data = png_bytes(3, (64, 64))
    import base64

    truncated = "data:image/png;base64," + base64.b64encode(data[: len(data) // 2]).decode()
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages("look:", truncated))
    assert "not a decodable image" in e.value.message
    assert e.value.param == "messages[0].content[1].image_url.url"
    assert chat(client, messages(data_url(1), "still there?")).choices[0].message.content


def test_video_is_refused(family, server, client):
    """Videos are not served (their processors need torchvision): a video part or video_data is a
    400 that says so."""
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [{"role": "user", "content": [video, {"type": "text", "text": "x"}]}])
    assert "'video_url' is not supported" in e.value.message
    r = requests.post(
        server.url + "/generate",
        timeout=60,
        json={"text": "x", "video_data": ["data:video/mp4;base64,AAAA"], "sampling_params": {}},
    )
    assert r.status_code == 400 and "video_data" in r.text
