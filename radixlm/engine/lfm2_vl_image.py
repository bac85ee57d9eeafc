"""LFM2-VL's image processor without torchvision: transformers' Lfm2VlImageProcessor (its only
one is a TorchvisionBackend) step for step, the same arithmetic on the same tensors.

Per image: smart_resize to a multiple of encoder_patch_size * downsample_factor between
min_image_tokens and max_image_tokens; an image too large for one tile (past max_pixels_tolerance
times the most pixels a tile takes) is resized to the grid of tile_size tiles (min_tiles to
max_tiles, the closest aspect ratio) and split, the smart-resized whole added as a thumbnail.
Every tile is cut into patch rows (C * p * p, channels last) and padded to max_num_patches,
with its pixel_attention_mask and spatial_shapes (patch rows, patch columns).

The resize is torchvision's resize_image for uint8 tensors, bilinear with antialias, as
transformers calls it: torch's interpolate, native uint8 where torchvision takes it (a CPU with
AVX2), else float32 then rounded. tests/vision/test_lfm2_vl_image.py runs transformers' own
processor beside it (a stand-in for that one torchvision function) and finds the same tensors.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
from transformers.processing_utils import ImagesKwargs

# The settings and their defaults (transformers' Lfm2VlImageProcessor's class attributes).
DEFAULTS = dict(
    downsample_factor=2,
    do_image_splitting=True,
    min_tiles=2,
    max_tiles=10,
    use_thumbnail=True,
    min_image_tokens=64,
    max_image_tokens=256,
    encoder_patch_size=16,
    tile_size=512,
    max_pixels_tolerance=2.0,
    rescale_factor=1 / 255,
    image_mean=list(IMAGENET_STANDARD_MEAN),
    image_std=list(IMAGENET_STANDARD_STD),
    do_pad=True,
    return_row_col_info=False,
)


def resize_uint8(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, C, H, W] uint8 -> [B, C, height, width]: torchvision's resize_image (bilinear,
    antialias) as it runs on this CPU."""
    if tuple(image.shape[-2:]) == (height, width):
        return image
    native = "AVX2" in torch.backends.cpu.get_cpu_capability()  # torchvision's own test
    x = image if native else image.float()
    x = torch.nn.functional.interpolate(
        x, size=[height, width], mode="bilinear", align_corners=False, antialias=True
    )
    return x if native else x.round_().to(torch.uint8)


def smart_resize(h: int, w: int, factor: int, min_tokens: int, max_tokens: int, patch: int):
    """(width, height), HF's Lfm2VlImageProcessor.smart_resize."""
    total = patch * factor
    lo, hi = min_tokens * patch**2 * factor**2, max_tokens * patch**2 * factor**2
    h_bar = max(total, round(h / total) * total)
    w_bar = max(total, round(w / total) * total)
    if h_bar * w_bar > hi:
        beta = math.sqrt(h * w / hi)
        h_bar = max(total, math.floor(h / beta / total) * total)
        w_bar = max(total, math.floor(w / beta / total) * total)
    elif h_bar * w_bar < lo:
        beta = math.sqrt(lo / (h * w))
        h_bar = math.ceil(h * beta / total) * total
        w_bar = math.ceil(w * beta / total) * total
    return w_bar, h_bar


@lru_cache(maxsize=64)
def target_ratios(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    ratios = {
        (w, h)
        for n in range(min_tiles, max_tiles + 1)
        for w in range(1, n + 1)
        for h in range(1, n + 1)
        if min_tiles <= w * h <= max_tiles
    }
    return sorted(ratios, key=lambda r: r[0] * r[1])


def grid_layout(h: int, w: int, min_tiles: int, max_tiles: int, tile: int) -> tuple[int, int]:
    """(columns, rows) of tiles: HF's find_closest_aspect_ratio (ties: the later ratio when the
    image covers over half its area)."""
    aspect, best, best_diff = w / h, (1, 1), float("inf")
    for ratio in target_ratios(min_tiles, max_tiles):
        diff = abs(aspect - ratio[0] / ratio[1])
        if diff < best_diff:
            best_diff, best = diff, ratio
        elif diff == best_diff and w * h > 0.5 * tile * tile * ratio[0] * ratio[1]:
            best = ratio
    return best


class Lfm2VlImagesKwargs(ImagesKwargs, total=False):
    """The keywords the processor passes (transformers' Lfm2VlImageProcessorKwargs)."""

    downsample_factor: int
    do_image_splitting: bool
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    min_image_tokens: int
    max_image_tokens: int
    encoder_patch_size: int
    tile_size: int
    max_pixels_tolerance: float
    do_pad: bool
    return_row_col_info: bool


class Lfm2VlImageProcessorNoTorchvision(BaseImageProcessor):
    """transformers' Lfm2VlImageProcessor for PIL images and arrays, without torchvision."""

    valid_kwargs = Lfm2VlImagesKwargs
    model_input_names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]

    def __init__(self, **kwargs):
        # transformers' fixed choices (do_pad: without it no spatial_shapes, which the model
        # needs): a saved config that changes them is refused by name
        fixed = (("resample", 2), ("do_rescale", True), ("do_normalize", True), ("do_pad", True))
        for key, wanted in fixed:
            if kwargs.get(key) not in (None, wanted):
                raise ValueError(
                    f"LFM2-VL image processor: {key} {kwargs[key]!r} is not served"
                    f" (transformers' Lfm2VlImageProcessor: {wanted!r})"
                )
        got = {k: kwargs.get(k, DEFAULTS[k]) for k in DEFAULTS}
        step = got["encoder_patch_size"] * got["downsample_factor"]
        if got["tile_size"] % step:
            raise ValueError(
                f"LFM2-VL image processor: tile_size {got['tile_size']} is not a multiple"
                f" of encoder_patch_size * downsample_factor ({step})"
            )
        # BaseImageProcessor's own __init__ sets what it knows; the rest are ours
        super().__init__(**{k: v for k, v in kwargs.items() if k not in DEFAULTS})
        for key, value in DEFAULTS.items():
            setattr(self, key, kwargs.get(key, value))
        tiles = (self.tile_size // self.encoder_patch_size) ** 2 if self.do_image_splitting else 0
        self.max_num_patches = max(self.max_image_tokens * self.downsample_factor**2, tiles)

    def __call__(self, images, **kwargs) -> BatchFeature:
        return self.preprocess(images, **kwargs)

    def preprocess(self, images, return_tensors=None, **kwargs) -> BatchFeature:
        s = {k: kwargs[k] if kwargs.get(k) is not None else getattr(self, k) for k in DEFAULTS}
        if not s["do_image_splitting"]:
            s["min_tiles"] = s["max_tiles"] = 1
        elif s["min_tiles"] > s["max_tiles"]:
            raise ValueError("min_tiles must be less than or equal to max_tiles")
        p, f = s["encoder_patch_size"], s["downsample_factor"]
        tile_patches = (s["tile_size"] // p) ** 2 if s["do_image_splitting"] else 0
        max_patches = max(s["max_image_tokens"] * f**2, tile_patches)
        flat = [im for sub in images for im in sub] if _nested(images) else _as_list(images)
        mean = torch.tensor(s["image_mean"]) * (1.0 / s["rescale_factor"])
        std = torch.tensor(s["image_std"]) * (1.0 / s["rescale_factor"])
        pixels, masks, shapes, rows, cols, sizes = [], [], [], [], [], []
        for image in flat:
            tiles, r, c, size = self._split(_to_uint8_chw(image), s)
            rows.append(r), cols.append(c), sizes.append(size)
            for t in tiles:
                x = (t.to(torch.float32) - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
                ph, pw = x.shape[-2] // p, x.shape[-1] // p
                x = x.reshape(x.shape[0], ph, p, pw, p).permute(1, 3, 2, 4, 0).reshape(ph * pw, -1)
                shapes.append([ph, pw])
                if s["do_pad"]:
                    mask = torch.ones(max_patches, dtype=torch.int32)
                    if ph * pw < max_patches:
                        x = torch.nn.functional.pad(x, (0, 0, 0, max_patches - ph * pw))
                        mask[ph * pw :] = 0
                    masks.append(mask)
                pixels.append(x)
        data = {"pixel_values": torch.stack(pixels)}
        if s["do_pad"]:
            data["pixel_attention_mask"] = torch.stack(masks)
            data["spatial_shapes"] = torch.tensor(shapes)
        if s["return_row_col_info"]:
            data.update(image_rows=rows, image_cols=cols, image_sizes=sizes)
        return BatchFeature(data=data, tensor_type=return_tensors)

    def _split(self, image: torch.Tensor, s: dict):
        """(tiles [C, h, w] uint8, rows, columns, the smart-resized [height, width]):
        HF's resize_and_split for one image."""
        _, height, width = image.shape
        p, f = s["encoder_patch_size"], s["downsample_factor"]
        total = p * f
        h_bar = max(p, round(height / total) * total)
        w_bar = max(p, round(width / total) * total)
        too_large = h_bar * w_bar > s["max_image_tokens"] * p**2 * f**2 * s["max_pixels_tolerance"]
        new_w, new_h = smart_resize(
            height, width, f, s["min_image_tokens"], s["max_image_tokens"], p
        )
        batch = image[None]
        if too_large and not s["min_tiles"] == s["max_tiles"] == 1:
            t = s["tile_size"]
            gw, gh = grid_layout(height, width, s["min_tiles"], s["max_tiles"], t)
            big = resize_uint8(batch, t * gh, t * gw)[0]
            tiles = [
                big[:, r * t : (r + 1) * t, c * t : (c + 1) * t]
                for r in range(gh)
                for c in range(gw)
            ]
            if s["use_thumbnail"] and gw * gh != 1:
                tiles.append(resize_uint8(batch, new_h, new_w)[0])
            return tiles, gh, gw, [new_h, new_w]
        return [resize_uint8(batch, new_h, new_w)[0]], 1, 1, [new_h, new_w]


def _nested(images) -> bool:
    return isinstance(images, (list, tuple)) and all(isinstance(i, (list, tuple)) for i in images)


def _as_list(images) -> list:
    return list(images) if isinstance(images, (list, tuple)) else [images]


def _to_uint8_chw(image) -> torch.Tensor:
    """A PIL image (converted to RGB, as HF's do_convert_rgb) or an HWC / CHW uint8 array ->
    [3, H, W] uint8, contiguous (HF's process_image)."""
    if hasattr(image, "convert"):  # PIL
        from transformers.image_transforms import convert_to_rgb

        image = np.array(image if image.mode == "RGB" else convert_to_rgb(image))
    x = torch.as_tensor(np.asarray(image))
    if x.ndim == 2:
        x = x[None].expand(3, -1, -1)
    elif x.shape[-1] in (1, 3, 4) and x.shape[0] not in (1, 3, 4):
        x = x.permute(2, 0, 1)
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    if x.dtype != torch.uint8:
        raise ValueError(f"LFM2-VL's image processor takes uint8 images, not {x.dtype}")
    return x[:3].contiguous()
