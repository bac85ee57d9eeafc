"""Idefics3 (HF Idefics3ForConditionalGeneration: SmolVLM's checkpoints carry it): a SigLIP vision
encoder, a connector (pixel shuffle + one linear layer) and a Llama decoder.

The processor splits each image into tiles plus the whole image downscaled, each with its own run of
placeholder tokens between text tokens (<row_1_col_1>, <global-img>, ...): every tile is one
MultimodalItem (engine/mm_processor.py), so the cache works per tile. The encoder and connector are
transformers' modules (the checkpoint's weights); the decoder is radixlm's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.llava import LlavaForConditionalGeneration


class Idefics3ForConditionalGeneration(LlavaForConditionalGeneration):
    NAME_MAP = (
        ("model.text_model.", "language_model.model."),
        ("model.vision_model.", "vision_model."),
        ("model.connector.", "connector."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        encoder_cls, connector_cls = self.tower_classes()
        self._build_text(config)
        self.vision_model = encoder_cls._from_config(config.vision_config)
        self.connector = connector_cls(config)

    @staticmethod
    def tower_classes() -> tuple[type, type]:
        """transformers' (vision encoder, connector) classes of the family."""
        from transformers.models.idefics3.modeling_idefics3 import (
            Idefics3Connector,
            Idefics3VisionTransformer,
        )

        return Idefics3VisionTransformer, Idefics3Connector

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """One batch of tiles through SigLIP and the connector: per tile, [image_seq_len,
        hidden]."""
        weight = self.connector.modality_projection.proj.weight
        pixels = torch.stack([it.pixel_values for it in items]).to(
            device=weight.device, dtype=weight.dtype
        )
        if all("pixel_attention_mask" in it.extra for it in items):
            mask = (
                torch.stack([it.extra["pixel_attention_mask"] for it in items])
                .to(weight.device)
                .bool()
            )
        else:
            mask = torch.ones(
                pixels.shape[0], *pixels.shape[2:], dtype=torch.bool, device=weight.device
            )
        p = self.config.vision_config.patch_size
        # A patch takes part when any of its pixels is real (HF's rule for padded tiles).
        patches = mask.unfold(1, p, p).unfold(2, p, p)
        patch_mask = patches.sum(dim=(-1, -2)) > 0
        hidden = self.vision_model(
            pixel_values=pixels, patch_attention_mask=patch_mask
        ).last_hidden_state
        return list(self.connector(hidden))
