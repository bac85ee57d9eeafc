"""Images through the server: the OpenAI client's image_url parts and /generate's image_data, the
radix cache keyed by image content (cached_tokens, the encoder's counters), and hostile images
(each a 4xx naming the field; the server keeps serving)."""

import base64
import http.server
import io
import threading
import time

import openai
import pytest
import requests
import torch

from radixlm.server.process import ServerProcess
from tests.vision.checkpoints import png_bytes
from tests.vision.conftest import data_url

N = 16
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow.png":
            time.sleep(3)
        body = png_bytes(7)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def image_host():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def vision_server(model_dir: str) -> ServerProcess:
    """Chunks of 8 tokens (image spans cut), images from 127.0.0.1 only, at most 1 MB, 1 s to
    fetch."""
    return ServerProcess(
        "--model-path",
        model_dir,
        "--kv-memory-gb",
        "0.05",
        "--num-threads",
        "1",
        "--enable-invariant-checks",
        "--chunked-prefill-size",
        "8",
        "--allowed-media-domains",
        "127.0.0.1",
        "--media-url-max-file-size-mb",
        "1",
        "--media-url-timeout",
        "1",
    )


@pytest.fixture(scope="module")
def server(tiny_llava_dir):
    s = vision_server(tiny_llava_dir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def messages(*parts):
    content = [
        (
            {"type": "image_url", "image_url": {"url": p}}
            if p.startswith(("data:", "http"))
            else {"type": "text", "text": p}
        )
        for p in parts
    ]
    return [{"role": "user", "content": content}]


def chat(client, msgs):
    return client.chat.completions.create(
        model="m",
        messages=msgs,
        max_tokens=N,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )


def encoder(server) -> dict:
    state = requests.get(server.url + "/get_server_info", timeout=30).json()["internal_state"]
    return {k: v for k, v in state.items() if k.startswith("mm_")}


def hf_answer(hf_llava, text, seeds):
    from PIL import Image

    model, proc = hf_llava
    images = [Image.open(io.BytesIO(png_bytes(s))).convert("RGB") for s in seeds]
    inputs = proc(text=text, images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    first_image = inputs["input_ids"][0].tolist().index(model.config.image_token_id)
    return out[0, inputs["input_ids"].shape[1] :].tolist(), first_image


def rendered(hf_llava, *parts):
    """The chat template's text for these parts, as the server renders it."""
    content = [
        {"type": "image"} if p.startswith("data:") else {"type": "text", "text": p} for p in parts
    ]
    return hf_llava[1].apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def test_models_list_says_image(client):
    assert client.models.list().data[0].model_extra["modalities"] == ["text", "image"]


def test_same_image_twice_is_cached_and_encoded_once(server, client, hf_llava):
    requests.post(server.url + "/flush_cache", timeout=30)
    text = "describe this picture in detail"
    msgs = messages(data_url(11), text)
    before = encoder(server)
    first = chat(client, msgs)
    second = chat(client, msgs)
    after = encoder(server)
    ref, first_image = hf_answer(hf_llava, rendered(hf_llava, data_url(11), text), [11])
    span_end = first_image + 16
    assert first.usage.prompt_tokens_details.cached_tokens < first_image + 1
    assert (
        second.usage.prompt_tokens_details.cached_tokens >= span_end
    )  # the whole image span came from the cache
    assert (
        after["mm_images_encoded"] - before["mm_images_encoded"] == 1
    )  # chunks of 8 and the second ask: one encode
    assert first.choices[0].model_extra["token_ids"] == ref  # HF's answer for this image
    assert second.choices[0].model_extra["token_ids"] == ref


def test_other_image_same_text_hits_up_to_the_image(server, client, hf_llava):
    text = "what is in this image?"
    chat(client, messages(data_url(21), text))
    before = encoder(server)
    other = chat(client, messages(data_url(22), text))
    ref, first_image = hf_answer(hf_llava, rendered(hf_llava, data_url(22), text), [22])
    assert (
        other.usage.prompt_tokens_details.cached_tokens == first_image
    )  # the hit stops at the image's first token
    assert encoder(server)["mm_images_encoded"] - before["mm_images_encoded"] == 1
    assert (
        other.choices[0].model_extra["token_ids"] == ref
    )  # the other image's answer (HF's), not the cached one's
    native = requests.post(
        server.url + "/generate",
        json={
            "text": rendered(hf_llava, data_url(22), text),
            "image_data": data_url(22),
            "sampling_params": SP,
        },
        timeout=120,
    )
    assert native.status_code == 200, native.text
    assert native.json()["output_ids"] == ref


def test_two_images_keep_their_order(server, hf_llava):
    text = "which is brighter?"
    for seeds in ([31, 32], [32, 31]):
        body = {
            "text": rendered(hf_llava, data_url(0), data_url(0), text),
            "sampling_params": SP,
            "image_data": [data_url(s) for s in seeds],
        }
        r = requests.post(server.url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == hf_answer(hf_llava, body["text"], seeds)[0]


def test_image_url_from_an_allowed_host(server, client, hf_llava, image_host):
    text = "and this one?"
    via_url = chat(client, messages(image_host + "/img.png", text))
    via_data = chat(client, messages(data_url(7), text))
    assert via_url.choices[0].message.content == via_data.choices[0].message.content


def _bomb() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (9000, 9000)).save(buf, format="PNG")  # 81 M pixels in ~80 KB
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _truncated() -> str:
    data = png_bytes(3, (64, 64))
    return "data:image/png;base64," + base64.b64encode(data[: len(data) // 2]).decode()


def _big() -> str:
    return (
        "data:image/png;base64," + base64.b64encode(png_bytes(4, (700, 700))).decode()
    )  # ~1.4 MB > 1 MB


HOSTILE = [
    (_bomb, "decompression bomb"),
    (_truncated, "not a decodable image"),
    (_big, "larger than 1 MB"),
    (lambda: "https://example.com/cat.png", "not allowed"),
    (lambda: "data:image/png;base64,%%%notbase64", "not valid base64"),
]


@pytest.mark.parametrize(
    "make,why", HOSTILE, ids=["bomb", "truncated", "too-big", "domain", "bad-base64"]
)
def test_hostile_images_are_400s_naming_the_field(server, client, make, why, hf_llava):
    url = make()
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages("look:", url))
    assert why in e.value.message and e.value.param == "messages[0].content[1].image_url.url"
    r = requests.post(
        server.url + "/generate",
        json={
            "text": rendered(hf_llava, data_url(0), "x"),
            "image_data": [url],
            "sampling_params": SP,
        },
        timeout=60,
    )
    assert r.status_code == 400 and why in r.text and "image_data[0]" in r.text
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert chat(client, messages(data_url(1), "still there?")).choices[0].message.content


def test_slow_url_times_out_and_100mb_body_is_refused(server, client, image_host):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages(image_host + "/slow.png", "x"))
    assert "longer than 1.0 s" in e.value.message
    huge = "data:image/png;base64," + "A" * (100 * 2**20)
    r = requests.post(
        server.url + "/v1/chat/completions",
        timeout=120,
        json={"model": "m", "messages": messages(huge, "x"), "max_tokens": 1},
    )
    assert r.status_code == 413
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_session_turn_with_an_image_is_a_400(server, hf_llava):
    sid = requests.post(
        server.url + "/open_session", json={"capacity_of_str_len": 1000}, timeout=30
    ).json()
    r = requests.post(
        server.url + "/generate",
        timeout=60,
        json={
            "text": rendered(hf_llava, data_url(0), "x"),
            "image_data": data_url(1),
            "sampling_params": SP,
            "session_params": {"id": sid},
        },
    )
    assert r.status_code == 400 and "image_data is not supported in session turns" in r.text
    requests.post(server.url + "/close_session", json={"session_id": sid}, timeout=30)
