"""Gemma 3 and Mistral 3 with images against HF transformers on tiny random checkpoints, through
the server (chunks of 8 tokens: image spans cut wherever the family allows) and the OpenAI client:
one image and two give HF's greedy tokens, a batch of /generate requests HF's tokens and logprobs
(1e-4), the same image asked again comes from the cache past its span (encoded once), text alone
is HF's. Gemma 3's image tokens attend each other both ways (HF's token_type_ids mask, on sliding
layers too: the second image ends past the window); HF with a causal mask instead gives other
logprobs, so the check has teeth. Mistral 3's images each keep their own size."""

from __future__ import annotations

import io

import pytest
import requests
import torch

from tests.vision.checkpoints import png_bytes
from tests.vision.conftest import data_url
from tests.vision.gemma3_mistral3_checkpoints import write_tiny_gemma3, write_tiny_mistral3
from tests.vision.test_vision_server import chat, client, encoder, messages, vision_server  # noqa: F401

N = 16
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
SIZES = [(40, 36), (24, 60)]  # Mistral 3: 5 rows of 5 tokens; 8 rows of 3 (plus their breaks)
FAMILIES = {
    "gemma3": (write_tiny_gemma3, "Gemma3ForConditionalGeneration"),
    "mistral3": (write_tiny_mistral3, "Mistral3ForConditionalGeneration"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, tokenizer_dir):
    import transformers

    from radixlm.engine.hf_processors import load_hf_processor

    write, arch = FAMILIES[request.param]
    path = write(str(tmp_path_factory.mktemp(request.param)), tokenizer_dir)
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, (model, load_hf_processor(path))


@pytest.fixture(scope="module")
def server(family):
    s = vision_server(family[1])
    yield s
    s.stop()


def rendered(hf, n_images: int, text: str, before: str = "") -> str:
    content = [{"type": "text", "text": before}] if before else []
    content += [{"type": "image"}] * n_images + [{"type": "text", "text": text}]
    return hf[1].apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def hf_generate(hf, text: str, images: list, causal: bool = False):
    """HF's greedy tokens, their log-softmax per step, and the end of the last image's span.
    causal: without Gemma 3's token_type_ids (no bidirectional image block)."""
    from PIL import Image

    model, proc = hf
    pics = [Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s, size in images]
    inputs = proc(text=text, images=pics or None, return_tensors="pt")
    if causal:
        inputs.pop("token_type_ids")
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
    ids = inputs["input_ids"][0].tolist()
    span = {model.config.image_token_id}
    if hasattr(proc, "image_break_token_id"):  # Pixtral's rows end in break / end tokens
        span |= {proc.image_break_token_id, proc.image_end_token_id}
    last = max((i for i, t in enumerate(ids) if t in span), default=-1)
    return (
        out.sequences[0, len(ids) :].tolist(),
        [torch.log_softmax(s[0].float(), -1) for s in out.scores],
        last + 1,
    )


def test_one_and_two_images_match_hf(family, server, client):
    _, _, hf = family
    text = "what differs between these?"
    for images in ([(1, SIZES[0])], [(2, SIZES[0]), (3, SIZES[1])], [(3, SIZES[1]), (2, SIZES[0])]):
        out = chat(client, messages(*[data_url(s, size) for s, size in images], text))
        ref = hf_generate(hf, rendered(hf, len(images), text), images)[0]
        assert out.choices[0].model_extra["token_ids"] == ref, images
    text = rendered(hf, 0, "no picture here, just words")
    plain = requests.post(
        server.url + "/generate", timeout=120, json={"text": text, "sampling_params": SP}
    )
    assert plain.json()["output_ids"] == hf_generate(hf, text, [])[0]


def test_repeated_image_is_served_from_the_cache(family, server, client):
    _, _, hf = family
    requests.post(server.url + "/flush_cache", timeout=30)
    text = "describe it"
    msgs = messages(data_url(11, SIZES[1]), text)
    before = encoder(server)
    first, second = chat(client, msgs), chat(client, msgs)
    ref, _, span_end = hf_generate(hf, rendered(hf, 1, text), [(11, SIZES[1])])
    assert second.usage.prompt_tokens_details.cached_tokens >= span_end
    assert encoder(server)["mm_images_encoded"] - before["mm_images_encoded"] == 1
    assert (
        first.choices[0].model_extra["token_ids"]
        == ref
        == second.choices[0].model_extra["token_ids"]
    )


def test_batch_tokens_and_logprobs_match_hf(family, server):
    name, _, hf = family
    cases = [("look: ", [(21, SIZES[0])]), ("compare ", [(22, SIZES[1]), (23, SIZES[0])])]
    texts = [rendered(hf, len(imgs), t) for t, imgs in cases]
    r = requests.post(
        server.url + "/generate",
        timeout=120,
        json={
            "text": texts,
            "image_data": [[data_url(s, size) for s, size in imgs] for _, imgs in cases],
            "sampling_params": SP,
            "return_logprob": True,
        },
    )
    assert r.status_code == 200, r.text
    assert len(r.json()) == len(cases)
    for out, text, (_, imgs) in zip(r.json(), texts, cases):
        tokens, logprobs, _ = hf_generate(hf, text, imgs)
        assert out["output_ids"] == tokens
        for step, (lp, tid, _) in enumerate(out["meta_info"]["output_token_logprobs"]):
            assert abs(lp - logprobs[step][tid].item()) < 1e-4, step
        if name == "gemma3":  # the bidirectional image block changes what HF computes
            causal = hf_generate(hf, text, imgs, causal=True)[1]
            assert len(causal) == len(logprobs)
            assert max((a - b).abs().max().item() for a, b in zip(causal, logprobs)) > 1e-3


def test_torch_backend_matches_hf(family):
    """The torch backend (Gemma 3: the image block in its per-request masks): a batch with one
    and two images in chunks of 8, HF's tokens and logprobs."""
    from radixlm import Engine
    from tests.conftest import engine_args

    _, path, hf = family
    cases = [("look: ", [(31, SIZES[0])]), ("compare ", [(32, SIZES[1]), (33, SIZES[0])])]
    texts = [rendered(hf, len(imgs), t) for t, imgs in cases]
    args = engine_args(attention_backend="torch", chunked_prefill_size=8)
    with Engine(path, **args) as engine:
        outs = engine.generate(
            texts,
            SP,
            image_data=[[data_url(s, size) for s, size in imgs] for _, imgs in cases],
            return_logprob=True,
        )
    assert len(outs) == len(cases)
    for out, text, (_, imgs) in zip(outs, texts, cases):
        tokens, logprobs, _ = hf_generate(hf, text, imgs)
        assert out["output_ids"] == tokens
        for step, (lp, tid, _) in enumerate(out["meta_info"]["output_token_logprobs"]):
            assert abs(lp - logprobs[step][tid].item()) < 1e-4, step


def test_a_chunk_never_ends_inside_a_bidirectional_image():
    """Admission's chunk: back to the image's start, or on to its end when it starts at or inside
    it (a cached prefix may end there); a causal model's images are cut anywhere."""
    from types import SimpleNamespace

    from radixlm.mm_inputs import MultimodalInputs, MultimodalItem
    from radixlm.scheduler.batching.admission import whole_spans

    items = tuple(MultimodalItem(k, off, 4, None) for k, off in ((1, 4), (2, 13)))

    def req(bidirectional):
        return SimpleNamespace(seqlen=30, mm_inputs=MultimodalInputs(items, bidirectional))

    # (tokens left to compute, chunk budget) -> the chunk
    cases = [(30, 8, 8), (30, 6, 4), (26, 8, 8), (26, 2, 4), (22, 8, 5), (17, 2, 4), (15, 1, 2)]
    for ext, take, want in cases:
        assert whole_spans(req(True), ext, take) == want, (ext, take)
        assert whole_spans(req(False), ext, take) == take


def test_pp2_matches_hf(family):
    """--pp-size 2: the first stage embeds the images; a prompt's prefill splits into pieces
    between the stages, never inside a Gemma 3 image (pp_micro.py). HF's tokens."""
    from PIL import Image

    from radixlm import Engine
    from tests.conftest import engine_args

    _, path, hf = family
    images = [(41, SIZES[0]), (42, SIZES[1])]
    pics = [Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s, size in images]
    for k in range(64):  # a prompt whose middle (where the pieces meet) is inside an image
        text = rendered(hf, 2, "which is brighter?", before="look " * k)
        ids = hf[1](text=text, images=pics, return_tensors="pt")["input_ids"][0].tolist()
        if ids[len(ids) // 2 - 1] == ids[len(ids) // 2] == hf[0].config.image_token_id:
            break
    else:
        raise AssertionError("no prompt puts the pieces' boundary inside an image")
    with Engine(path, **engine_args(pp_size=2, chunked_prefill_size=256)) as engine:
        out = engine.generate(text, SP, image_data=[data_url(s, size) for s, size in images])
    assert out["output_ids"] == hf_generate(hf, text, images)[0]
