"""Gemma 3 with images (HF Gemma3ForConditionalGeneration: every instruct Gemma 3 from 4B up): a
SigLIP vision tower, Gemma 3's projector (the patch grid average-pooled to mm_tokens_per_image, an
RMSNorm "soft embedding norm", one projection) and radixlm's Gemma 3 decoder (gemma3.py).

What differs from LLaVA: the text embeddings are scaled by sqrt(hidden) and the image rows are not
(HF scatters the projector's output over the scaled embeddings), and the tokens of one image attend
each other both ways (HF's token_type_ids block mask: causal OR same image, and on sliding layers
that AND the window). The image spans ask for it (MultimodalInputs.bidirectional); the attention
backends that honour it (native, torch) give each image token the keys up to its image's end, and
admission never cuts an image span between prefill chunks (scheduler/batching/admission.py), so an
image's keys are all there when its queries run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.gemma3 import Gemma3ForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration
from radixlm.model.traits import ModelTraits


class Gemma3ForConditionalGeneration(LlavaForConditionalGeneration):
    TEXT_MODELS = {"gemma3_text": Gemma3ForCausalLM}
    # transformers >= 4.52 (model.*) and the released checkpoints' layout (language_model.model.*,
    # vision_tower.vision_model.*, multi_modal_projector.*) -> this module's names.
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        from transformers import AutoModel
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

        if getattr(config.text_config, "use_bidirectional_attention", False):
            raise ValueError(
                "text_config.use_bidirectional_attention: a bidirectional Gemma 3 (EmbeddingGemma)"
                " is not a generative model"
            )
        vision = config.vision_config
        if vision.model_type != "siglip_vision_model":
            raise ValueError(
                f"vision_config.model_type {vision.model_type!r}: Gemma 3 takes a SigLIP tower"
            )
        side = vision.image_size // vision.patch_size
        per_side = int(round(config.mm_tokens_per_image**0.5))
        if per_side * per_side != config.mm_tokens_per_image or side % per_side:
            raise ValueError(
                f"mm_tokens_per_image {config.mm_tokens_per_image}: not a square that pools the"
                f" {side}x{side} patch grid evenly"
            )
        self._build_text(config)
        self.vision_tower = AutoModel.from_config(vision)  # SiglipVisionModel
        self.multi_modal_projector = Gemma3MultiModalProjector(config)

    def traits(self) -> ModelTraits:
        return ModelTraits(
            modalities=self.modalities,
            encoder_cache=self.encoder_cache,
            bidirectional_images=True,
        )

    def embed_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed(input_ids, None)  # scaled by sqrt(hidden)

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """One batch through SigLIP and the projector: per image, [mm_tokens_per_image, hidden]."""
        weight = self.multi_modal_projector.mm_input_projection_weight
        pixels = torch.stack([it.pixel_values for it in items]).to(
            device=weight.device, dtype=weight.dtype
        )
        hidden = self.vision_tower(pixel_values=pixels).last_hidden_state
        return list(self.multi_modal_projector(hidden))
