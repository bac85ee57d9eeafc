"""Kimi-K2.5's image processor without torchvision: transformers' Kimi_K25ImageProcessor is a
TorchvisionBackend only (no PIL variant), and torchvision is not a radixlm dependency. This is the
same processing on PIL / NumPy (transformers' PilBackend), step for step:

- navit_resize: the patch budget (`max_patches`) and the per-side cap (`size["max_height"]`
  patches of `patch_size`), never upscaling; then zero padding at the bottom and right to a
  multiple of `merge_size * patch_size` (the pad is 0 before normalization, as in HF);
- rescale by 1/255 and normalize by `image_mean` / `image_std`;
- patchify to [grid_h * grid_w, 3, patch, patch] (row-major over the patch grid) and
  image_grid_thw = [1, grid_h, grid_w] per image; the images' patches are concatenated.

Only the resampling kernel may differ from HF's: PIL's bicubic here, torchvision's antialiased
bicubic on uint8 tensors there (how far apart is not measured: torchvision is absent here).
tests/vision/test_kimi_k25.py runs HF's own _preprocess (its navit_resize, padding, normalization,
patchify and grids) with this resize and compares.
"""

from __future__ import annotations

import math

import numpy as np
from transformers.image_processing_backends import PilBackend
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import (
    IMAGENET_STANDARD_MEAN,
    IMAGENET_STANDARD_STD,
    PILImageResampling,
    SizeDict,
)
from transformers.processing_utils import ImagesKwargs


class Kimi_K25ImageProcessorKwargs(ImagesKwargs, total=False):
    max_patches: int
    patch_size: int
    merge_size: int


def navit_resize(
    height: int,
    width: int,
    patch_size: int,
    merge_kernel_size: int,
    max_patches: int,
    max_size_per_side: int,
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((resized h, w), (padded h, w)): transformers' kimi_k25 navit_resize, line for line."""
    num_patches_h = max(1.0, height // patch_size)
    num_patches_w = max(1.0, width // patch_size)
    current_patch_count = num_patches_h * num_patches_w
    scale_for_total_patches = math.sqrt(max_patches / current_patch_count)
    scale_for_height_patches = (max_size_per_side * patch_size) / height
    scale_for_width_patches = (max_size_per_side * patch_size) / width
    scale = min(1.0, scale_for_total_patches, scale_for_height_patches, scale_for_width_patches)
    new_height, new_width = max(1, int(height * scale)), max(1, int(width * scale))
    new_height = min(new_height, max_size_per_side * patch_size)
    new_width = min(new_width, max_size_per_side * patch_size)
    factor = merge_kernel_size * patch_size
    pad_height = (factor - new_height % factor) % factor + new_height
    pad_width = (factor - new_width % factor) % factor + new_width
    return (new_height, new_width), (pad_height, pad_width)


def patchify(image: np.ndarray, patch_size: int) -> tuple[np.ndarray, int, int]:
    """[C, H, W] -> ([grid_h * grid_w, C, patch, patch], grid_h, grid_w): HF's patchify for one
    image."""
    c, h, w = image.shape
    gh, gw = h // patch_size, w // patch_size
    patches = image.reshape(c, gh, patch_size, gw, patch_size).transpose(1, 3, 0, 2, 4)
    return patches.reshape(gh * gw, c, patch_size, patch_size), gh, gw


class Kimi_K25ImageProcessorPil(PilBackend):
    do_resize = True
    resample = PILImageResampling.BICUBIC
    size = {"max_height": 512, "max_width": 512}
    max_patches = 16384
    do_rescale = True
    do_normalize = True
    image_mean = IMAGENET_STANDARD_MEAN
    image_std = IMAGENET_STANDARD_STD
    do_convert_rgb = True
    patch_size = 14
    merge_size = 2
    valid_kwargs = Kimi_K25ImageProcessorKwargs
    model_input_names = ["pixel_values", "image_grid_thw"]

    def _validate_preprocess_kwargs(self, size: SizeDict | None = None, **kwargs) -> dict:
        if size is not None and (
            size.max_height is None or size.max_width is None or size.max_height != size.max_width
        ):
            raise ValueError(
                f"size must contain 'max_height' and 'max_width' keys with identical values but"
                f" got {size}."
            )
        super()._validate_preprocess_kwargs(size=size, **kwargs)

    def _preprocess(
        self,
        images: list[np.ndarray],
        do_resize: bool,
        size: SizeDict,
        resample,
        do_rescale: bool,
        rescale_factor: float,
        do_normalize: bool,
        image_mean,
        image_std,
        patch_size: int,
        merge_size: int,
        max_patches: int,
        return_tensors=None,
        **kwargs,
    ) -> BatchFeature:
        import torch

        pixel_values, grids = [], []
        for image in images:
            if do_resize:
                height, width = image.shape[-2:]
                (rh, rw), (ph, pw) = navit_resize(
                    height, width, patch_size, merge_size, max_patches, size.max_height
                )
                image = self.resize(image, SizeDict(height=rh, width=rw), resample=resample)
                image = self.pad([image], pad_size=SizeDict(height=ph, width=pw))[0]
            if do_rescale:
                image = self.rescale(image, rescale_factor)
            if do_normalize:
                image = self.normalize(image.astype(np.float32), image_mean, image_std)
            patches, gh, gw = patchify(np.asarray(image, dtype=np.float32), patch_size)
            pixel_values.append(torch.from_numpy(np.ascontiguousarray(patches)))
            grids.append([1, gh, gw])
        return BatchFeature(
            data={
                "pixel_values": torch.cat(pixel_values),
                "image_grid_thw": torch.tensor(grids, dtype=torch.long),
            },
            tensor_type=return_tensors,
        )

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs=None) -> int:
        images_kwargs = images_kwargs or {}
        side = (
            images_kwargs["size"]["max_height"]
            if "size" in images_kwargs
            else self.size["max_height"]
        )
        patch = images_kwargs.get("patch_size", self.patch_size)
        _, (ph, pw) = navit_resize(
            height,
            width,
            patch_size=patch,
            merge_kernel_size=images_kwargs.get("merge_size", self.merge_size),
            max_patches=images_kwargs.get("max_patches", self.max_patches),
            max_size_per_side=side,
        )
        return (ph // patch) * (pw // patch)
