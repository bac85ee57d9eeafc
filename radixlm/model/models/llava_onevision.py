"""LLaVA-OneVision (HF LlavaOnevisionForConditionalGeneration: llava-onevision-qwen2-0.5b / 7b /
72b-ov-hf): a SigLIP tower and LLaVA's MLP projector, as LLaVA (llava.py), with OneVision's
any-resolution layout and a Qwen2 (or Llama) decoder.

An image alone in its prompt is the whole image resized to the tower's size plus the grid of patches
of the pinpoint resolution closest to it (`image_grid_pinpoints`); the grid's features are laid
out as one picture, its padding cut away (HF's unpad_image), bilinearly shrunk when larger than
`anyres_max_N` patches (`vision_aspect_ratio`), and each row closed by `image_newline`. An image
among several is the whole image only, then one `image_newline` (HF, from its processor's
`batch_num_images`). Each image is one MultimodalItem, whose pixels (one patch, or the whole grid)
and size are in its hash. Videos (their 2x2 pooling) are not served.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.llama import LlamaForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration, LlavaProjector
from radixlm.model.models.qwen2 import Qwen2ForCausalLM


class LlavaOnevisionForConditionalGeneration(LlavaForConditionalGeneration):
    TEXT_MODELS = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        from transformers import AutoModel

        vision = config.vision_config
        if vision.model_type not in ("siglip_vision_model", "clip_vision_model"):
            raise ValueError(
                f"vision_config.model_type {vision.model_type!r}: LLaVA-OneVision takes a SigLIP"
                " (or CLIP) tower"
            )
        # the patch grid must stay square: SigLIP has no CLS token to drop, CLIP's must go (HF
        # cannot lay out either otherwise)
        strategy = "full" if vision.model_type == "siglip_vision_model" else "default"
        if config.vision_feature_select_strategy != strategy:
            raise ValueError(
                f"vision_feature_select_strategy {config.vision_feature_select_strategy!r}: a"
                f" {vision.model_type} tower takes {strategy!r}"
            )
        if not config.vision_aspect_ratio.startswith("anyres_max_"):
            raise ValueError(
                f"vision_aspect_ratio {config.vision_aspect_ratio!r}:"
                " 'anyres_max_N' (as HF reads it)"
            )
        self._build_text(config)
        self.vision_tower = AutoModel.from_config(vision)
        self.multi_modal_projector = LlavaProjector(config)
        self.image_newline = nn.Parameter(torch.zeros(config.text_config.hidden_size))

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """The patches of a batch of images through SigLIP and the projector at once, then each
        image laid out (HF LlavaOnevisionModel.get_image_features + pack_image_features)."""
        weight = self.multi_modal_projector.linear_1.weight
        pixels = torch.cat([it.pixel_values for it in items]).to(
            device=weight.device, dtype=weight.dtype
        )
        layer = self.config.vision_feature_layer
        states = self.vision_tower(pixels, output_hidden_states=True).hidden_states
        feats = (
            states[layer]
            if isinstance(layer, int)
            else torch.cat([states[i] for i in layer], dim=-1)
        )
        if self.config.vision_feature_select_strategy == "default":
            feats = feats[:, 1:]
        feats = self.multi_modal_projector(feats)
        per_image = torch.split(feats, [it.pixel_values.shape[0] for it in items])
        return [
            self._layout(f, it.extra["image_sizes"].tolist()) for f, it in zip(per_image, items)
        ]

    def _layout(self, feats: torch.Tensor, size: list[int]) -> torch.Tensor:
        """One image's [patches, tokens, hidden] -> its [span, hidden] (HF pack_image_features)."""
        from transformers.models.llava_onevision.modeling_llava_onevision import (
            get_anyres_image_grid_shape,
            unpad_image,
        )

        newline = self.image_newline.to(feats.dtype)
        base = feats[0]
        if feats.shape[0] == 1:  # an image among several: the whole image alone
            return torch.cat((base, newline[None]), dim=0)
        vision = self.config.vision_config
        side = vision.image_size // vision.patch_size
        rows, cols = get_anyres_image_grid_shape(
            size, self.config.image_grid_pinpoints, vision.image_size
        )
        grid = feats[1:].view(rows, cols, side, side, -1)
        grid = grid.permute(4, 0, 2, 1, 3).contiguous().flatten(1, 2).flatten(2, 3)
        grid = unpad_image(grid, size)
        max_patches = int(self.config.vision_aspect_ratio.removeprefix("anyres_max_"))
        channels, h, w = grid.shape
        ratio = math.sqrt(h * w / (max_patches * side**2))
        if ratio > 1.1:  # larger than anyres_max_N patches: shrunk, as HF does
            grid = nn.functional.interpolate(
                grid[None], [int(h // ratio), int(w // ratio)], mode="bilinear"
            )[0]
        grid = torch.cat((grid, newline[:, None, None].expand(*grid.shape[:-1], 1)), dim=-1)
        return torch.cat((base, grid.flatten(1, 2).transpose(0, 1)), dim=0)
