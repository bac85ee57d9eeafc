"""SmolVLM (HF SmolVLMForConditionalGeneration: SmolVLM-256M / 500M / 2.2B-Instruct, SmolVLM2):
Idefics3's architecture (idefics3.py: a SigLIP encoder, the pixel-shuffle connector, a Llama
decoder; the same checkpoint names) under transformers' SmolVLM classes. SmolVLM's processor lays
out each image as Idefics3's does (tiles with <row_r_col_c>, then <global-img>), through its own
class, loaded for images only (engine/hf_processors.py: its video processor needs torchvision);
video input is not served.
"""

from __future__ import annotations

from radixlm.model.models.idefics3 import Idefics3ForConditionalGeneration


class SmolVLMForConditionalGeneration(Idefics3ForConditionalGeneration):
    @staticmethod
    def tower_classes() -> tuple[type, type]:
        from transformers.models.smolvlm.modeling_smolvlm import (
            SmolVLMConnector,
            SmolVLMVisionTransformer,
        )

        return SmolVLMVisionTransformer, SmolVLMConnector
