"""Qwen3.5 with images (HF Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration):
Qwen3-VL's vision tower (transformers' Qwen3_5VisionModel / Qwen3_5MoeVisionModel, the
checkpoint's weights: 3-D patch embedding, a learned position grid resampled to each image's grid,
2-D rotary, a patch merger; no DeepStack features) before Qwen3.5's hybrid decoder (qwen3_5.py,
qwen3_next.py), which turns by interleaved M-RoPE.

Everything between them is Qwen2-VL's path (qwen2_vl.py): the processor's grid per image, pad
values from the image's content (so the hybrid prefix cache's snapshots, keyed on the same token
ids, never serve another image), the encoder cache, M-RoPE positions from each image's grid
(model/executor/mrope.py: transformers' Qwen3_5Model.get_rope_index places images as Qwen2-VL's
does).
The decoder's recurrent state layers make this model hybrid: it answers the runner's num_kv_layers
and state_specs for its decoder.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.models.hybrid_vlm import HybridTextMixin
from radixlm.model.models.qwen2_vl import Qwen2VLForConditionalGeneration
from radixlm.model.models.qwen3_5 import Qwen3_5ForCausalLM
from radixlm.model.models.qwen3_next import Qwen3_5MoeForCausalLM


class Qwen3_5TextForImages(Qwen3_5ForCausalLM):
    MROPE = True


class Qwen3_5MoeTextForImages(Qwen3_5MoeForCausalLM):
    MROPE = True


class Qwen3_5VLForConditionalGeneration(HybridTextMixin, Qwen2VLForConditionalGeneration):
    TEXT_MODELS = {
        "qwen3_5_text": Qwen3_5TextForImages,
        "qwen3_5_moe_text": Qwen3_5MoeTextForImages,
    }
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.visual.", "visual."),
    )
    SKIPPED_PREFIXES = ("mtp.",)  # the multi-token-prediction head (not run)

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        # transformers ties the head by the top level's tie_word_embeddings, not the text config's
        config.text_config.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self._build_text(config)
        self.visual = self._tower_class(config.vision_config)._from_config(config.vision_config)

    @staticmethod
    def _tower_class(vision_config: Any) -> type:
        if vision_config.model_type == "qwen3_5_moe_vision":
            from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
                Qwen3_5MoeVisionModel,
            )

            return Qwen3_5MoeVisionModel
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

        return Qwen3_5VisionModel

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        dispatch = getattr(self.language_model, "expert_dispatch", None)  # the MoE decoder's
        if dispatch is not None:  # (its own forward starts it; LLaVA's runs the decoder's model)
            dispatch.begin(input_ids.shape[0])
        return super().forward(input_ids, positions, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights((n, t) for n, t in weights if not n.startswith(self.SKIPPED_PREFIXES))
