"""Kimi-K2.5 (Kimi_K25ForConditionalGeneration: MoonViT + projector + a DeepSeek-V3 decoder, MLA and
MoE) against HF transformers on a tiny random float32 checkpoint (kimi_k25_checkpoint.py), through
the Engine, prefill whole and in chunks of 8 tokens (image runs cut): greedy tokens and their
logprobs to 1e-4 for text alone, a batch, a second turn from the radix cache, one image and two of
different grids; the same image again served from the cache past its span; a malformed image
refused naming the field; bad config fields refused by name; the top-level tie_word_embeddings
followed as transformers does; and radixlm's PIL image processor against HF's own
Kimi_K25ImageProcessor (torchvision only: run here with its resize and pad on PIL / torch)."""

from __future__ import annotations

import io
import os
import re
import sys
import types

import numpy as np
import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.model.deepseek_refs import assert_matches_hf as assert_text_matches
from tests.model.deepseek_refs import hf_reference as text_reference
from tests.model.deepseek_refs import random_prompts
from tests.vision.checkpoints import assert_matches_hf, hf_greedy, png_bytes
from tests.vision.conftest import data_url
from tests.vision.kimi_k25_checkpoint import IMAGE, write_tiny_kimi_k25

N = 24
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_kimi_k25(str(tmp_path_factory.mktemp("tiny-kimi-k25")), tokenizer_dir)


@pytest.fixture(scope="module")
def hf(kimi_dir):
    """transformers' model (it reads the released layout its save_pretrained wrote) and the
    processor radixlm loads."""
    from transformers.models.kimi_k25 import Kimi_K25ForConditionalGeneration

    from radixlm.engine.hf_processors import load_hf_processor

    model = Kimi_K25ForConditionalGeneration.from_pretrained(kimi_dir, dtype=torch.float32)
    return model.eval(), load_hf_processor(kimi_dir)


@pytest.fixture(scope="module", params=[8, 512], ids=["chunked", "whole"])
def engine(request, kimi_dir):
    chunk = request.param
    with Engine(kimi_dir, **engine_args(chunked_prefill_size=chunk, max_prefill_tokens=chunk)) as e:
        yield e


def test_text_alone_and_batched(engine, hf):
    model, _ = hf
    assert engine.scheduler_info["architecture"] == "Kimi_K25ForConditionalGeneration"
    prompts = random_prompts([40, 5, 17, 30], seed=9)
    refs = [text_reference(model, p) for p in prompts]
    out = engine.generate(input_ids=prompts[0], sampling_params=SP, return_logprob=True)
    assert_text_matches(out, prompts[0], refs[0], "alone")
    assert engine.flush_cache()
    outs = engine.generate(input_ids=prompts[1:], sampling_params=SP, return_logprob=True)
    for i, o in enumerate(outs):
        assert_text_matches(o, prompts[1 + i], refs[1 + i], f"batched #{i}")


def test_text_second_turn_from_the_radix_cache(engine, hf):
    model, _ = hf
    assert engine.flush_cache()
    first = random_prompts([30], seed=10)[0]
    out = engine.generate(input_ids=first, sampling_params=SP)
    second = first + out["output_ids"] + random_prompts([7], seed=11)[0]
    ref = text_reference(model, second)
    out = engine.generate(input_ids=second, sampling_params=SP, return_logprob=True)
    assert out["meta_info"]["cached_tokens"] >= len(first)
    assert_text_matches(out, second, ref, "second turn")


def hf_reference(hf, text, images):
    return hf_greedy(hf, text, images, N)


CASES = [
    ("what is an image?", []),
    (IMAGE + "what is this?", [(1, (70, 40))]),  # 12 x 6 patches after the budget: 18 tokens
    (IMAGE + "and " + IMAGE + "differ how?", [(2, (40, 36)), (3, (30, 90))]),  # 20 + 24 tokens
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


def test_same_image_again_is_served_from_the_cache(engine):
    text = PROMPT.format(IMAGE + "what is this?")
    sp = {"max_new_tokens": 4, "temperature": 0}
    assert engine.flush_cache()
    first = engine.generate(text, sp, image_data=[data_url(5, (70, 40))])
    again = engine.generate(text, sp, image_data=[data_url(5, (70, 40))])
    other = engine.generate(text, sp, image_data=[data_url(6, (70, 40))])
    assert again["output_ids"] == first["output_ids"]
    prompt = first["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == prompt - 1  # past the image's span
    assert other["meta_info"]["cached_tokens"] < 8  # the text before the image only


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
        engine.generate(PROMPT.format(IMAGE + "x"), {"max_new_tokens": 2}, image_data=images)


def _config(**overrides):
    import transformers
    from transformers.models.kimi_k25 import Kimi_K25Config

    from tests.model.deepseek_refs import COMMON

    text = (
        overrides.pop("text_config", None)
        or transformers.DeepseekV3Config(**COMMON, q_lora_rank=24).to_dict()
    )
    vision = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, patch_size=4)
    vision.update(overrides.pop("vision_config", {}))
    cfg = Kimi_K25Config(
        text_config=text, vision_config=vision, **{"projection_hidden_size": 32, **overrides}
    )
    cfg.architectures = ["Kimi_K25ForConditionalGeneration"]
    return cfg


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(projection_hidden_size=48), "projection_hidden_size"),
        (dict(vision_config=dict(hidden_size=24)), "vision_config.hidden_size"),
        (dict(vision_config=dict(merge_kernel_size=[2, 2, 2])), "vision_config.merge_kernel_size"),
        (dict(text_config={"model_type": "qwen2"}), "text_config.model_type"),
    ],
    ids=["projection", "vision-heads", "merge-kernel", "decoder"],
)
def test_bad_config_is_refused_by_field(overrides, field):
    from radixlm.model.models.kimi_k25 import Kimi_K25ForConditionalGeneration

    with torch.device("meta"):
        Kimi_K25ForConditionalGeneration(_config())
        with pytest.raises(ValueError, match=re.escape(field)):
            Kimi_K25ForConditionalGeneration(_config(**overrides))


def test_tied_embeddings_follow_the_top_level_field(tmp_path, tokenizer_dir):
    """transformers ties lm_head by the top-level tie_word_embeddings, not text_config's: a
    checkpoint saying True at the top and False in its text config is served tied, as HF runs
    it."""
    from transformers.models.kimi_k25 import Kimi_K25ForConditionalGeneration as HF

    from radixlm.model.loader import load_model

    path = write_tiny_kimi_k25(
        str(tmp_path),
        tokenizer_dir,
        tie_word_embeddings=True,
        text_config={"tie_word_embeddings": False},
    )
    hf = HF.from_pretrained(path, dtype=torch.float32)
    assert hf.config.text_config.tie_word_embeddings is False
    assert hf.lm_head.weight.data_ptr() == hf.model.language_model.embed_tokens.weight.data_ptr()
    lm = load_model(path).model.language_model
    assert lm.tie_word_embeddings
    assert torch.equal(lm.model.embed_tokens.weight, hf.model.language_model.embed_tokens.weight)


def test_transformers_module_names_load_too(kimi_dir, hf, tmp_path):
    """The same weights under transformers' module names (model.language_model.*, the split
    q / k / v in its RoPE order) load into the same parameters as the released layout."""
    import shutil

    from safetensors.torch import save_file

    from radixlm.model.loader import load_model

    model, _ = hf
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{kimi_dir}/{name}", tmp_path / name)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "model.safetensors"),
    )
    released = dict(load_model(kimi_dir).model.named_parameters())
    renamed = dict(load_model(str(tmp_path)).model.named_parameters())
    assert released.keys() == renamed.keys()
    for name, p in released.items():
        assert torch.equal(p, renamed[name]), name


def test_released_architecture_name_loads_the_same_model(kimi_dir, tmp_path):
    """moonshotai's config.json names its remote code's class, KimiK25ForConditionalGeneration
    (model_type kimi_k25, which transformers reads): served as transformers' class."""
    import json
    import shutil

    from radixlm.model.loader import load_model

    for name in os.listdir(kimi_dir):
        shutil.copy(f"{kimi_dir}/{name}", tmp_path / name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["KimiK25ForConditionalGeneration"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    released = dict(load_model(kimi_dir).model.named_parameters())
    renamed = dict(load_model(str(tmp_path)).model.named_parameters())
    assert released.keys() == renamed.keys()
    assert all(torch.equal(p, renamed[n]) for n, p in released.items())


def _hf_image_processor(monkeypatch):
    """transformers' Kimi_K25ImageProcessor (a TorchvisionBackend) without torchvision: the few
    torchvision functions it calls given as PIL's bicubic resize (radixlm's kernel), torch's
    zero pad and normalize; everything else (navit_resize, the grouping, the fused rescale and
    normalize, patchify, the grids) is transformers' own code."""
    import transformers.image_processing_backends as backends
    from PIL import Image
    from transformers.image_utils import PILImageResampling

    fn = types.ModuleType("torchvision.transforms.v2.functional")

    def resize(img, size, interpolation=None, antialias=True):
        out = [
            torch.from_numpy(
                np.array(
                    Image.fromarray(x.permute(1, 2, 0).numpy()).resize(
                        (size[1], size[0]), resample=Image.BICUBIC
                    )
                )
            ).permute(2, 0, 1)
            for x in img.reshape(-1, *img.shape[-3:])
        ]
        return torch.stack(out).reshape(*img.shape[:-2], *size)

    def pad(img, padding, fill=0, padding_mode="constant"):
        left, top, right, bottom = padding
        return torch.nn.functional.pad(img, (left, right, top, bottom), value=fill)

    def normalize(img, mean, std, inplace=False):
        mean = torch.as_tensor(mean, dtype=img.dtype)[:, None, None]
        return (img - mean) / torch.as_tensor(std, dtype=img.dtype)[:, None, None]

    fn.resize, fn.pad, fn.normalize = resize, pad, normalize
    fn.InterpolationMode = types.SimpleNamespace(
        LANCZOS="lanczos", BILINEAR="bilinear", BICUBIC="bicubic"
    )
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torchvision.transforms.v2.functional", fn)
    monkeypatch.setattr(backends, "tvF", fn, raising=False)
    monkeypatch.setattr(
        backends,
        "pil_torch_interpolation_mapping",
        {PILImageResampling.BICUBIC: "bicubic"},
        raising=False,
    )
    name = "transformers.models.kimi_k25.image_processing_kimi_k25"
    monkeypatch.delitem(sys.modules, name, raising=False)
    import importlib

    module = importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name)  # not left behind bound to the stand-ins
    return module


@pytest.mark.parametrize(
    "settings",
    [
        dict(patch_size=4, merge_size=2, max_patches=64, size={"max_height": 16, "max_width": 16}),
        dict(
            patch_size=14,
            merge_size=2,
            max_patches=16384,
            size={"max_height": 512, "max_width": 512},
        ),
        dict(patch_size=4, merge_size=2, max_patches=4096, size={"max_height": 8, "max_width": 8}),
    ],
    ids=["tiny", "released", "per-side-cap"],
)
def test_pil_image_processor_matches_hf(monkeypatch, settings):
    """Pixel values (to float rounding) and grids equal transformers' image processor's over sizes
    that scale by the patch budget, by the per-side cap, not at all, and a thin strip."""
    from PIL import Image

    from radixlm.engine.kimi_k25_image import Kimi_K25ImageProcessorPil, navit_resize

    hf_module = _hf_image_processor(monkeypatch)
    ours = Kimi_K25ImageProcessorPil(**settings)
    theirs = hf_module.Kimi_K25ImageProcessor(**settings)
    sizes = [(70, 40), (40, 36), (30, 90), (3, 200), (64, 64), (9, 9), (640, 480), (1000, 30)]
    images = [
        Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s, size in enumerate(sizes)
    ]
    a = theirs(images, return_tensors="pt")
    b = ours(images, return_tensors="pt")
    assert b["image_grid_thw"].tolist() == a["image_grid_thw"].tolist()
    assert b["pixel_values"].shape == a["pixel_values"].shape
    assert (b["pixel_values"] - a["pixel_values"]).abs().max().item() < 1e-5
    args = settings["patch_size"], settings["merge_size"], settings["max_patches"]
    for h in range(1, 400, 7):
        for w in (1, 13, 57, 200, 999):
            side = settings["size"]["max_height"]
            assert navit_resize(h, w, *args, side) == hf_module.navit_resize(h, w, *args, side)
    for size in sizes:
        assert ours.get_number_of_image_patches(size[1], size[0]) == (
            theirs.get_number_of_image_patches(size[1], size[0])
        )
