"""LFM2-VL against HF transformers on a tiny random float32 checkpoint (lfm2vl_checkpoint.py:
SigLIP2 NaFlex, the pixel-unshuffle projector, a hybrid LFM2 decoder), through the Engine with
chunks of 8 tokens (every tile's run cut) and whole: greedy tokens and their logprobs to 1e-4 for
text alone, one image (2 tiles + the thumbnail), two images (a tiled one and a single-tile one);
text prompts batched, and a second turn resuming from the radix cache; the same image asked again
served from the cache past its span (a prompt whose last chunk is its last token alone: the
snapshot one token before the end is taken in the chunk before); radixlm's image features equal
HF's get_image_features; a malformed image refused naming the field; bad config fields refused
naming the field."""

import io
import re

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.checkpoints import assert_matches_hf, hf_greedy, png_bytes
from tests.vision.conftest import data_url
from tests.vision.lfm2vl_checkpoint import write_tiny_lfm2vl

N = 16
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
IMG = "<image>"
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def lfm2vl_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_lfm2vl(str(tmp_path_factory.mktemp("tiny-lfm2vl")), tokenizer_dir)


@pytest.fixture(scope="module")
def hf(lfm2vl_dir):
    """transformers' model and the processor radixlm loads (Lfm2VlProcessor with radixlm's image
    processor: transformers' needs torchvision; test_lfm2_vl_image.py finds the two equal)."""
    from transformers import Lfm2VlForConditionalGeneration

    from radixlm.engine.hf_processors import load_hf_processor

    model = Lfm2VlForConditionalGeneration.from_pretrained(lfm2vl_dir, dtype=torch.float32)
    return model.eval(), load_hf_processor(lfm2vl_dir)


@pytest.fixture(scope="module", params=[8, 512], ids=["chunked", "whole"])
def engine(request, lfm2vl_dir):
    chunk = request.param
    with Engine(
        lfm2vl_dir, **engine_args(chunked_prefill_size=chunk, max_prefill_tokens=chunk)
    ) as e:
        yield e


def hf_reference(hf, text, images, n=N):
    return hf_greedy(hf, text, images, n)


CASES = [
    ("what is an image?", []),
    (IMG + "what is this?", [(1, (70, 40))]),  # 2x1 tiles of 16 tokens + a 15-token thumbnail
    (IMG + "and " + IMG + "differ how?", [(2, (40, 36)), (3, (30, 90))]),  # 12; 1x3 + thumb
]


@pytest.mark.parametrize("body,images", CASES, ids=["text", "one-image", "two-images"])
def test_greedy_and_logprobs_match_hf(engine, hf, body, images):
    text = PROMPT.format(body)
    tokens, logprobs = hf_reference(hf, text, images)
    out = engine.generate(
        text,
        SP,
        image_data=[data_url(s, size) for s, size in images] or None,
        return_logprob=True,
        top_logprobs_num=5,
    )
    assert_matches_hf(out, tokens, logprobs)


def test_text_batched_and_second_turn_from_the_cache(engine, hf):
    bodies = ["what is a radix tree?", "name three colours", "count to five"]
    texts = [PROMPT.format(b) for b in bodies]
    refs = [hf_reference(hf, t, []) for t in texts]
    outs = engine.generate(texts, SP, return_logprob=True, top_logprobs_num=5)
    for out, (tokens, logprobs) in zip(outs, refs):
        assert_matches_hf(out, tokens, logprobs)
    # the second turn: the first turn's prompt and answer, then a new question
    tok = hf[1].tokenizer
    second = texts[0] + tok.decode(refs[0][0]) + "<|im_end|>\n" + PROMPT.format("and then?")
    engine.generate(texts[0], SP)  # the first turn in the cache again (a flush may precede)
    tokens, logprobs = hf_reference(hf, second, [])
    out = engine.generate(second, SP, return_logprob=True, top_logprobs_num=5)
    assert_matches_hf(out, tokens, logprobs)
    assert out["meta_info"]["cached_tokens"] >= len(tok(texts[0])["input_ids"]) - 1


def test_same_image_again_is_served_from_the_cache(engine):
    text = PROMPT.format(IMG + "what is this?")
    sp = {"max_new_tokens": 4, "temperature": 0}
    assert engine.flush_cache()
    first = engine.generate(text, sp, image_data=[data_url(5, (70, 40))])
    again = engine.generate(text, sp, image_data=[data_url(5, (70, 40))])
    other = engine.generate(text, sp, image_data=[data_url(6, (70, 40))])
    assert again["output_ids"] == first["output_ids"]
    prompt = first["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == prompt - 1  # past the image's span
    # the text before the first tile's run only
    assert other["meta_info"]["cached_tokens"] < 8


@pytest.mark.parametrize(
    "images,why",
    [
        (["data:image/png;base64,%%%notbase64"], "image_data[0]: not valid base64"),
        ([data_url(1), data_url(2)], "image_data: 2 image(s) given but the prompt has 1"),
    ],
    ids=["bad-base64", "count"],
)
def test_malformed_image_names_the_field(engine, images, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        engine.generate(PROMPT.format(IMG + "x"), {"max_new_tokens": 2}, image_data=images)


def test_image_features_match_hf(lfm2vl_dir, hf):
    """radixlm's encode_images over the items its processor makes (tiles of several grids, one
    batch padded to the longest) against HF's get_image_features: equal to 1e-5."""
    import transformers
    from PIL import Image

    from radixlm.engine.media import MediaConfig
    from radixlm.engine.mm_processor import MultimodalProcessor
    from radixlm.model.models.lfm2_vl import Lfm2VlForConditionalGeneration

    model, _ = hf
    ours = Lfm2VlForConditionalGeneration(transformers.AutoConfig.from_pretrained(lfm2vl_dir))
    state = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    res = ours.load_state_dict(
        {k: v for k, v in state.items() if not k.startswith(("language_model", "lm_head"))},
        strict=False,
    )
    assert not res.unexpected_keys
    assert all(k.startswith("language_model.") for k in res.missing_keys)
    mp = MultimodalProcessor(lfm2vl_dir, 10**6, MediaConfig())
    sizes = [(70, 40), (40, 36), (30, 90), (10, 7)]
    imgs = [Image.open(io.BytesIO(png_bytes(i, s))).convert("RGB") for i, s in enumerate(sizes)]
    text = mp.image_token * len(imgs)
    _, mm = mp.process(text, imgs, "image_data")
    out = mp.processor(text=text, images=imgs, return_tensors="pt")
    with torch.no_grad():
        ref = model.model.get_image_features(
            out["pixel_values"], out["spatial_shapes"], out["pixel_attention_mask"]
        ).pooler_output
        mine = ours.encode_images(list(mm.items))
    assert [it.length for it in mm.items] == [r.shape[0] for r in ref]
    for a, b in zip(mine, ref):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
    "field,value,why",
    [
        ("downsample_factor", 0, "downsample_factor 0"),
        ("projector_hidden_act", "nope", "projector_hidden_act 'nope'"),
        ("image_token_id", 10**7, "image_token_id 10000000"),
        ("vision_config.model_type", "siglip_vision_model", "vision_config.model_type"),
        ("text_config.model_type", "llama", "text_config.model_type 'llama'"),
    ],
)
def test_bad_config_fields_are_refused_by_name(lfm2vl_dir, field, value, why):
    import transformers

    from radixlm.model.models.lfm2_vl import Lfm2VlForConditionalGeneration

    cfg = transformers.AutoConfig.from_pretrained(lfm2vl_dir)
    target, _, name = field.rpartition(".")
    setattr(getattr(cfg, target) if target else cfg, name, value)
    with pytest.raises(ValueError, match=re.escape(why)):
        Lfm2VlForConditionalGeneration(cfg)
