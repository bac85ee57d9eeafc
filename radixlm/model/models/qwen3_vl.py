"""Qwen3-VL and Qwen3-VL-MoE (HF Qwen3VLForConditionalGeneration /
Qwen3VLMoeForConditionalGeneration): Qwen3-VL's vision tower (transformers' Qwen3VLVisionModel /
Qwen3VLMoeVisionModel, the checkpoint's weights: 3-D patch embedding, a learned position grid
resampled to each image's grid, 2-D rotary, a patch merger) and a Qwen3 / Qwen3-MoE decoder that
turns by interleaved M-RoPE and takes DeepStack features.

What is new against Qwen2-VL (qwen2_vl.py, whose path this is otherwise: the processor's grid per
image, pad values from the image's content, the encoder cache, M-RoPE positions from each grid):
- interleaved M-RoPE: frequency j turns with height where j % 3 == 1, width where j % 3 == 2 (up
  to 3 x their sections), else time; transformers' Qwen3VLTextRotaryEmbedding always recomposes so,
  whatever the config says, with sections [24, 20, 20] when it names none;
- DeepStack (layers/deepstack.py): the tower's mergers after `deepstack_visual_indexes` give one
  more feature per image token for each of the first decoder layers, added to that layer's output
  at the image's rows. The encoder cache keeps them beside the embedding (one row of
  hidden * (1 + layers) per token), so an image served from it, or a chunk that starts inside its
  span, gets its rows of both.

Text alone is Qwen3's (all three positions equal: plain RoPE). The MoE decoder's router always
renormalizes its top-k (the config has no norm_topk_prob), and the released checkpoints stack the
experts transposed: gate_up_proj [E, hidden, 2 * inter], down_proj [E, inter, hidden].
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.deepstack import DeepStack, DeepStackLayers
from radixlm.model.layers.moe.expert_dispatch import expert_dispatch
from radixlm.model.layers.moe.moe_block import MoeSpec
from radixlm.model.mm_embed import image_pieces
from radixlm.model.models.llama import LlamaModel
from radixlm.model.models.moe import MoeModel
from radixlm.model.models.moe_families import Qwen3MoeForCausalLM
from radixlm.model.models.qwen2_vl import Qwen2VLForConditionalGeneration
from radixlm.model.models.qwen3 import Qwen3ForCausalLM

DEFAULT_MROPE_SECTION = [24, 20, 20]  # transformers' Qwen3VLTextRotaryEmbedding's


class Qwen3VLTextModel(DeepStackLayers, LlamaModel):
    pass


class Qwen3VLMoeTextModel(DeepStackLayers, MoeModel):
    pass


class Qwen3VLTextForCausalLM(Qwen3ForCausalLM):
    """The decoder of Qwen3VLForConditionalGeneration."""

    def build_model(self, config: Any) -> nn.Module:
        return Qwen3VLTextModel(config, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm)


class Qwen3VLMoeTextForCausalLM(Qwen3MoeForCausalLM):
    """The decoder of Qwen3VLMoeForConditionalGeneration."""

    def build_model(self, config: Any) -> nn.Module:
        self.expert_dispatch = expert_dispatch()  # one for every MoE layer (as MoeForCausalLM's)
        return Qwen3VLMoeTextModel(config, self)

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(
            config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size, True
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights((n, self._as_rows(n, t)) for n, t in weights)

    def _as_rows(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """An expert stack in the experts' row layout ([E, 2I, H] / [E, H, I]). The released
        files hold them as x @ W ([E, H, 2I] / [E, I, H]), transformers' save_pretrained in its
        in-memory layout; like transformers (conversion_mapping's qwen3_vl_moe, check_dims), a
        stack already of the row shape is kept."""
        c = self.config
        if name.endswith(".mlp.experts.gate_up_proj"):
            rows = (c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size)
        elif name.endswith(".mlp.experts.down_proj"):
            rows = (c.num_experts, c.hidden_size, c.moe_intermediate_size)
        else:
            return t
        return t if tuple(t.shape) == rows else t.transpose(1, 2)


def _interleaved_mrope(text_config: Any) -> None:
    """The text config's rope parameters as transformers runs them: interleaved M-RoPE."""
    params = dict(text_config.rope_parameters or {})
    params.setdefault("mrope_section", list(DEFAULT_MROPE_SECTION))
    params["mrope_interleaved"] = True
    text_config.rope_parameters = params


class Qwen3VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    TEXT_MODELS = {
        "qwen3_vl_text": Qwen3VLTextForCausalLM,
        "qwen3_vl_moe_text": Qwen3VLMoeTextForCausalLM,
    }
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.visual.", "visual."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        # transformers ties the head by the top level's tie_word_embeddings, not the text config's
        config.text_config.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        _interleaved_mrope(config.text_config)
        self._build_text(config)
        self.visual = self._tower_class(config.vision_config)._from_config(config.vision_config)
        self.num_deepstack = len(config.vision_config.deepstack_visual_indexes)
        stack = self.language_model.model
        if self.num_deepstack > config.text_config.num_hidden_layers:
            raise ValueError(
                f"vision_config.deepstack_visual_indexes: {self.num_deepstack} DeepStack layers"
                f" for a decoder of {config.text_config.num_hidden_layers}"
            )
        if not stack.pp.is_first and stack.pp.layers.start < self.num_deepstack:
            raise ValueError(
                f"{type(self).__name__}: a pipeline stage after the first holds decoder layer"
                f" {stack.pp.layers.start}, which takes DeepStack features (the first"
                f" {self.num_deepstack} layers must be on the first stage)"
            )

    @staticmethod
    def _tower_class(vision_config: Any) -> type:
        if vision_config.model_type == "qwen3_vl_moe_vision":
            from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import (
                Qwen3VLMoeVisionModel,
            )

            return Qwen3VLMoeVisionModel
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        return Qwen3VLVisionModel

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """Per image, [its grid's tokens, hidden * (1 + DeepStack layers)]: the merger's embedding,
        then each DeepStack merger's features."""
        pixels, grids = self.tower_inputs(items)
        out = self.visual(pixels, grid_thw=grids)
        merged = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)
        return list(torch.split(merged, [it.length for it in items]))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        stack = self.language_model.model
        if not stack.pp.is_first:  # the images (and their DeepStack layers) were on the first
            return stack(input_ids, positions, forward_batch)
        pieces = image_pieces(forward_batch, self.encoder_cache, self.encode_images)
        if pieces is None:  # no image span here; a draft may copy a pad value (never sampled)
            return stack(input_ids.clamp(max=self.vocab_size - 1), positions, forward_batch)
        pieces, deepstack = DeepStack.split(pieces, stack.hidden_size, self.num_deepstack)
        embeds = self.embed_text(input_ids.masked_fill(input_ids >= self.vocab_size, 0))
        for start, rows in pieces:
            embeds[start : start + rows.shape[0]] = rows.to(embeds.dtype)
        stack.deepstack = deepstack
        try:
            return stack(input_ids, positions, forward_batch, input_embeds=embeds)
        finally:
            stack.deepstack = None
