"""radixlm's LFM2-VL image processor (engine/lfm2_vl_image.py) against transformers' own
Lfm2VlImageProcessor, whose only implementation is a TorchvisionBackend and torchvision is not
installed here. transformers' code runs as it is, torchvision stood in by the one function it calls
on these inputs, transcribed: torchvision.transforms.v2.functional.resize_image (bilinear,
antialias; torch's interpolate on uint8 where the CPU has AVX2, else in float32 then rounded) and
normalize ((x - mean) / std per channel). The stand-in lives only inside the fixture.

Over the released defaults (512 px tiles, 64 to 256 tokens) and the tiny checkpoint's settings,
for small, single-tile, tiled (landscape, portrait, panorama) and odd sizes: pixel_values,
pixel_attention_mask, spatial_shapes, rows / columns / sizes equal exactly, and Lfm2VlProcessor
with either image processor writes the same token ids. One case is checked against numbers worked
out by hand from HF's code as well."""

from __future__ import annotations

import enum
import importlib
import sys
import types

import numpy as np
import pytest
import torch

from tests.vision.lfm2vl_checkpoint import IMAGE_SETTINGS

HF_MODULE = "transformers.models.lfm2_vl.image_processing_lfm2_vl"


def _torchvision_stand_in() -> dict[str, types.ModuleType]:
    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        NEAREST_EXACT = "nearest-exact"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    def resize(image, size, interpolation=InterpolationMode.BILINEAR, antialias=True):
        # torchvision 0.2x's resize_image, for the bilinear case transformers uses here
        assert interpolation == InterpolationMode.BILINEAR
        shape = image.shape
        c, old_h, old_w = shape[-3:]
        new_h, new_w = size
        if (new_h, new_w) == (old_h, old_w):
            return image
        dtype = image.dtype
        acceptable = [torch.float32, torch.float64]
        if image.device.type == "cpu" and "AVX2" in torch.backends.cpu.get_cpu_capability():
            acceptable.append(torch.uint8)
        image = image.reshape(-1, c, old_h, old_w)
        need_cast = dtype not in acceptable
        if need_cast:
            image = image.to(torch.float32)
        image = torch.nn.functional.interpolate(
            image, size=[new_h, new_w], mode="bilinear", align_corners=False, antialias=antialias
        )
        if need_cast:
            image = image.round_().to(dtype)
        return image.reshape(shape[:-3] + (c, new_h, new_w))

    def normalize(x, mean, std, inplace=False):
        mean = torch.as_tensor(mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=x.dtype).view(-1, 1, 1)
        if not inplace:
            x = x.clone()
        return x.sub_(mean).div_(std)

    def grayscale_to_rgb(x):
        return x if x.shape[-3] == 3 else x.expand(*x.shape[:-3], 3, *x.shape[-2:])

    tv = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    v2 = types.ModuleType("torchvision.transforms.v2")
    functional = types.ModuleType("torchvision.transforms.v2.functional")
    functional.resize, functional.normalize = resize, normalize
    functional.grayscale_to_rgb, functional.InterpolationMode = grayscale_to_rgb, InterpolationMode
    v2.functional, transforms.v2, transforms.InterpolationMode = functional, v2, InterpolationMode
    tv.transforms = transforms
    return {
        "torchvision": tv,
        "torchvision.transforms": transforms,
        "torchvision.transforms.v2": v2,
        "torchvision.transforms.v2.functional": functional,
    }


@pytest.fixture(scope="module")
def hf_image_processor_cls():
    """transformers' Lfm2VlImageProcessor, imported with the stand-in; all of it undone after."""
    import transformers.image_processing_backends as backends
    import transformers.image_utils as image_utils
    from transformers.image_utils import PILImageResampling as R

    if importlib.util.find_spec("torchvision") is not None:  # transformers' own, as it runs
        yield importlib.import_module(HF_MODULE).Lfm2VlImageProcessor
        return
    mods = _torchvision_stand_in()
    mode = mods["torchvision.transforms.v2.functional"].InterpolationMode
    mapping = {R.NEAREST: mode.NEAREST, R.BILINEAR: mode.BILINEAR, R.BICUBIC: mode.BICUBIC}
    with pytest.MonkeyPatch.context() as mp:
        # imported earlier (without the stand-in): imported again under it, the old one restored
        mp.delitem(sys.modules, HF_MODULE, raising=False)
        for name, mod in mods.items():
            mp.setitem(sys.modules, name, mod)
        mp.setattr(backends, "tvF", mods["torchvision.transforms.v2.functional"], raising=False)
        mp.setattr(backends, "pil_torch_interpolation_mapping", mapping, raising=False)
        mp.setattr(image_utils, "pil_torch_interpolation_mapping", mapping, raising=False)
        try:
            yield importlib.import_module(HF_MODULE).Lfm2VlImageProcessor
        finally:
            sys.modules.pop(HF_MODULE, None)
            package = sys.modules.get("transformers.models.lfm2_vl")
            if package is not None and "image_processing_lfm2_vl" in vars(package):
                delattr(package, "image_processing_lfm2_vl")


def _image(seed: int, w: int, h: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


SIZES = {
    "released": [
        (48, 40),
        (300, 200),
        (640, 480),
        (480, 640),
        (1200, 300),
        (2000, 1500),
        (913, 977),
    ],
    "tiny": [(10, 7), (40, 36), (70, 40), (30, 90), (64, 64), (200, 30), (33, 130)],
}


@pytest.mark.parametrize("settings", list(SIZES))
def test_same_tensors_as_transformers(hf_image_processor_cls, settings):
    from radixlm.engine.lfm2_vl_image import Lfm2VlImageProcessorNoTorchvision

    kw = IMAGE_SETTINGS if settings == "tiny" else {}
    ours, theirs = Lfm2VlImageProcessorNoTorchvision(**kw), hf_image_processor_cls(**kw)
    images = [_image(i, w, h) for i, (w, h) in enumerate(SIZES[settings])]
    for batch in ([[im] for im in images], [images]):  # one image a sample; all in one
        a = ours(batch, return_row_col_info=True, return_tensors="pt")
        b = theirs(batch, return_row_col_info=True, return_tensors="pt")
        assert set(a) == set(b)
        for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        for key in ("image_rows", "image_cols", "image_sizes"):
            assert torch.as_tensor(a[key]).tolist() == torch.as_tensor(b[key]).tolist(), key
    assert len(set(map(tuple, a["spatial_shapes"].tolist()))) > 2  # tiles and several sizes


def test_the_processor_writes_the_same_prompt(hf_image_processor_cls, tokenizer_dir, tmp_path):
    from radixlm.engine.hf_processors import load_hf_processor
    from tests.vision.lfm2vl_checkpoint import write_tiny_lfm2vl

    ours = load_hf_processor(write_tiny_lfm2vl(str(tmp_path), tokenizer_dir))
    theirs = type(ours)(
        image_processor=hf_image_processor_cls(**IMAGE_SETTINGS), tokenizer=ours.tokenizer
    )
    images = [_image(i, w, h) for i, (w, h) in enumerate(SIZES["tiny"][:4])]
    text = "<image>a<image>b\n<image><image>?"
    a, b = (p(text=text, images=images, return_tensors="pt") for p in (ours, theirs))
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["pixel_values"], b["pixel_values"])


def test_hand_worked_case():
    """70 x 40 under the tiny settings (patch 4, factor 2, 4 to 16 tokens, 32 px tiles), from HF's
    code by hand: rounded to 8 px it is 72 x 40 = 2880 pixels, past 16 * 8^2 * 2 = 2048: tiled.
    Aspect 1.75 is closest to 2:1 -> 2 tiles of 32 x 32 (8 x 8 patches, 16 tokens each); the
    thumbnail is smart-resized to at most 1024 pixels: beta = sqrt(2800 / 1024), 40 / beta -> 24,
    70 / beta -> 40: 6 x 10 patches, 15 tokens."""
    from radixlm.engine.lfm2_vl_image import Lfm2VlImageProcessorNoTorchvision

    out = Lfm2VlImageProcessorNoTorchvision(**IMAGE_SETTINGS)(
        [[_image(0, 70, 40)]], return_row_col_info=True
    )
    assert out["spatial_shapes"].tolist() == [[8, 8], [8, 8], [6, 10]]
    assert out["pixel_attention_mask"].sum(-1).tolist() == [64, 64, 60]
    assert out["pixel_values"].shape == (3, 64, 3 * 4 * 4)
    assert (out["image_rows"], out["image_cols"], out["image_sizes"]) == ([1], [2], [[24, 40]])


@pytest.mark.parametrize(
    "field,value",
    [
        ("resample", 3),
        ("do_normalize", False),
        ("do_rescale", False),
        ("do_pad", False),
        ("tile_size", 30),
    ],
)
def test_settings_it_does_not_serve_are_refused_by_name(field, value):
    from radixlm.engine.lfm2_vl_image import Lfm2VlImageProcessorNoTorchvision

    with pytest.raises(ValueError, match=f"{field} {value!r}"):
        Lfm2VlImageProcessorNoTorchvision(**{**IMAGE_SETTINGS, field: value})
