"""Qwen2-VL and Qwen2.5-VL (HF Qwen2VLForConditionalGeneration /
Qwen2_5_VLForConditionalGeneration): a ViT at dynamic resolution (each image its own grid of
patches, `temporal_patch_size` frames per patch, 2-D rotary; Qwen2.5-VL: window attention outside
its full-attention blocks), a patch merger (spatial_merge_size^2 patches -> one token), and a Qwen2
decoder with M-RoPE (three positions per token: model/executor/mrope.py, MRotaryEmbedding).

The vision tower is transformers' (the checkpoint's weights): one forward per step for all the
images the step needs, whatever their sizes (one packed sequence, attention within each image). The
decoder is radixlm's Qwen2; everything else (pad values, the encoder cache, chunks cutting an image)
is LLaVA's path (llava.py, mm_embed.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.llava import LlavaForConditionalGeneration
from radixlm.model.models.qwen2 import Qwen2ForCausalLM


class Qwen2VLForConditionalGeneration(LlavaForConditionalGeneration):
    TEXT_MODELS = {"qwen2_vl_text": Qwen2ForCausalLM, "qwen2_5_vl_text": Qwen2ForCausalLM}
    # transformers >= 4.52's layout (model.language_model.*, model.visual.*) and the original one
    # the Qwen checkpoints carry (model.layers.*, visual.*); lm_head.* -> language_model.lm_head.*
    # (LLaVA's _map_name).
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.visual.", "visual."),
        ("model.", "language_model.model."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        # The text config has no tie_word_embeddings of its own: the top level's (Qwen2-VL-2B ties).
        config.text_config.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self._build_text(config)
        self.visual = self._vision_tower()._from_config(config.vision_config)

    @staticmethod
    def _vision_tower() -> type:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )

        return Qwen2VisionTransformerPretrainedModel

    def tower_inputs(self, items: list[MultimodalItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """The images' patches packed into one sequence, and their grids: the tower's inputs."""
        weight = self.visual.patch_embed.proj.weight
        pixels = torch.cat([it.pixel_values for it in items]).to(
            device=weight.device, dtype=weight.dtype
        )
        grids = torch.stack([it.extra["image_grid_thw"] for it in items]).to(weight.device)
        return pixels, grids

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """The images through the tower and the merger in one sequence: per image, [its grid's
        tokens, hidden]."""
        pixels, grids = self.tower_inputs(items)
        merged = self.visual(pixels, grid_thw=grids).pooler_output
        return list(torch.split(merged, [it.length for it in items]))


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    @staticmethod
    def _vision_tower() -> type:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        return Qwen2_5_VisionTransformerPretrainedModel
