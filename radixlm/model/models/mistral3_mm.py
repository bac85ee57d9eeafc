"""Mistral 3 with images (HF Mistral3ForConditionalGeneration: Mistral Small 3.1 / 3.2, Magistral
Small, Devstral Small's multimodal saves): the Pixtral vision tower (transformers'
PixtralVisionModel: each image at its own size, 2-D RoPE, images apart from each other), Mistral 3's
projector (RMSNorm, a learned merge of spatial_merge_size^2 patches, a two-layer MLP) and radixlm's
Mistral / Llama decoder.

Pixtral lays an image out as rows of [IMG] tokens, each row closed by [IMG_BREAK] and the last by
[IMG_END]. The whole layout is one image span (its pad values, its cache key): the span's embedding
is the rows' image features with the break and end tokens' own embeddings between them (HF scatters
the features over the [IMG] positions and keeps the others' text embeddings), so a cache hit and a
chunk cutting the span anywhere take the same rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.llama import LlamaForCausalLM, MistralForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration


class Mistral3ForConditionalGeneration(LlavaForConditionalGeneration):
    TEXT_MODELS = {"mistral": MistralForCausalLM, "llama": LlamaForCausalLM}
    # transformers >= 4.52 (model.*) and the released checkpoints' layout (language_model.model.*,
    # language_model.lm_head, vision_tower.*, multi_modal_projector.*).
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        from transformers import AutoModel
        from transformers.models.mistral3.modeling_mistral3 import Mistral3MultiModalProjector

        if config.vision_config.model_type != "pixtral":
            raise ValueError(
                f"vision_config.model_type {config.vision_config.model_type!r}: Mistral 3 takes a"
                " Pixtral tower"
            )
        self._build_text(config)
        self.vision_tower = AutoModel.from_config(config.vision_config)  # PixtralVisionModel
        self.multi_modal_projector = Mistral3MultiModalProjector(config)
        self.image_token_id = config.image_token_id

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """The images padded to one size and run together (Pixtral's attention keeps them apart,
        as in HF's batch), the projector, then per image its span: [rows * (cols + 1), hidden]."""
        weight = self.multi_modal_projector.linear_1.weight
        sizes = torch.stack([it.extra["image_sizes"] for it in items]).to(torch.int64)
        h, w = (int(x) for x in sizes.max(dim=0).values)
        pixels = torch.zeros(len(items), 3, h, w, dtype=weight.dtype, device=weight.device)
        for k, it in enumerate(items):
            ph, pw = it.pixel_values.shape[-2:]
            pixels[k, :, :ph, :pw] = it.pixel_values.to(pixels)
        states = self.vision_tower(
            pixels, image_sizes=sizes, output_hidden_states=True
        ).hidden_states
        layer = self.config.vision_feature_layer
        feats = (
            states[layer]
            if isinstance(layer, int)
            else torch.cat([states[i] for i in layer], dim=-1)
        )
        feats = self.multi_modal_projector(feats.squeeze(0), sizes)
        ratio = self.vision_tower.patch_size * self.config.spatial_merge_size
        per_image = feats.split((sizes // ratio).prod(dim=-1).tolist())
        out = []
        for it, f in zip(items, per_image):
            ids = it.extra["span_ids"].to(weight.device)
            span = self.embed_text(ids.masked_fill(ids == self.image_token_id, 0)).clone()
            span[ids == self.image_token_id] = f.to(span.dtype)
            out.append(span)
        return out
