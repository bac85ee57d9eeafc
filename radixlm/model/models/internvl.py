"""InternVL (HF InternVLForConditionalGeneration: InternVL3 / InternVL3.5 "-hf" checkpoints): the
InternViT vision tower (transformers' InternVLVisionModel, the checkpoint's weights: a CLS token,
pre-norm layers with layer scale, optional QK-norm and RMSNorm), pixel shuffle by
`downsample_ratio`, an MLP projector with its own LayerNorm, and a Qwen2 / Qwen3 / Llama decoder
(radixlm's).

The processor (InternVLProcessor, its GotOcr2 PIL image processor) crops each image into up to
`max_patches` tiles plus a thumbnail and writes <img> + image_seq_length <IMG_CONTEXT> per tile +
</img>: every tile is one MultimodalItem (engine/mm_processor.py), cached on its own, as
Idefics3's tiles are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.llama import LlamaForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration
from radixlm.model.models.qwen2 import Qwen2ForCausalLM
from radixlm.model.models.qwen3 import Qwen3ForCausalLM


def pixel_shuffle(features: torch.Tensor, scale: float) -> torch.Tensor:
    """[B, W, H, C] -> [B, W * scale, H * scale, C / scale^2], HF InternVLModel.pixel_shuffle's
    order (its axes named so: the patch grid is square, so the names do not matter)."""
    b, w, h, c = features.shape
    if (h * scale) % 1 or (w * scale) % 1:
        raise ValueError(f"a {w}x{h} patch grid does not shuffle by {scale}")
    x = features.view(b, w, int(h * scale), int(c / scale))
    x = x.permute(0, 2, 1, 3).contiguous()
    x = x.view(b, int(h * scale), int(w * scale), int(c / (scale * scale)))
    return x.permute(0, 2, 1, 3).contiguous()


class InternVLForConditionalGeneration(LlavaForConditionalGeneration):
    TEXT_MODELS = {
        "qwen2": Qwen2ForCausalLM,
        "qwen3": Qwen3ForCausalLM,
        "llama": LlamaForCausalLM,
    }
    # transformers' layout (model.vision_tower.*, model.multi_modal_projector.*,
    # model.language_model.*) -> this module's names.
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        from transformers.models.internvl.modeling_internvl import (
            InternVLMultiModalProjector,
            InternVLVisionModel,
        )

        vision = config.vision_config
        if vision.model_type != "internvl_vision":
            raise ValueError(
                f"vision_config.model_type {vision.model_type!r}: InternVL takes its InternViT"
                " tower (internvl_vision)"
            )
        if config.vision_feature_select_strategy != "default":
            # with the CLS token kept the patch grid is not square: HF cannot run it either
            raise ValueError(
                f"vision_feature_select_strategy {config.vision_feature_select_strategy!r}:"
                " InternVL drops the CLS token ('default')"
            )
        if not isinstance(config.vision_feature_layer, int):
            raise ValueError("InternVL takes one vision_feature_layer (an int), as HF does")
        self._build_text(config)
        self.vision_tower = InternVLVisionModel(vision)
        self.multi_modal_projector = InternVLMultiModalProjector(config)

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """One batch of tiles through InternViT, the pixel shuffle and the projector: per tile,
        [image_seq_length, hidden] (HF InternVLModel.get_image_features)."""
        weight = self.multi_modal_projector.linear_1.weight
        pixels = torch.stack([it.pixel_values for it in items]).to(
            device=weight.device, dtype=weight.dtype
        )
        layer = self.config.vision_feature_layer
        out = self.vision_tower(pixel_values=pixels, output_hidden_states=layer != -1)
        feats = out.last_hidden_state if layer == -1 else out.hidden_states[layer]
        feats = feats[:, 1:]  # the CLS token is no image token ("default", checked at load)
        b, n, c = feats.shape
        side = int(n**0.5)
        feats = pixel_shuffle(feats.reshape(b, side, side, c), self.config.downsample_ratio)
        return list(self.multi_modal_projector(feats.reshape(b, -1, feats.shape[-1])))
