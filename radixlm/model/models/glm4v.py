"""GLM-4.1V-Thinking, GLM-4.5V and GLM-4.6V (HF Glm4vForConditionalGeneration,
Glm4vMoeForConditionalGeneration, Glm46VForConditionalGeneration; transformers' modeling_glm4v,
modeling_glm4v_moe and modeling_glm46v are the reference).

The vision tower is transformers' (Glm4vVisionModel / Glm4vMoeVisionModel, the checkpoint's
weights): a Conv3d patch embedding over temporal_patch_size frames, an RMSNorm after it, a learned
position grid resampled (bicubic) to each image's grid, 2-D rotary in every block, then a
strided-conv downsample (spatial_merge_size^2 patches -> one token) and the patch merger. It runs
once per step for all the images the step needs (one packed sequence, attention within each image).

The decoder is radixlm's, turning by M-RoPE (rope_parameters.mrope_section, transformers' default
[8, 12, 12] when the config names none) over its partial rotary dims:
- Glm4vForConditionalGeneration / Glm46VForConditionalGeneration with a `glm4v_text` config: GLM-4's
  dense decoder (glm4.py: sandwich norms, interleaved rotary pairs, which load_weights turns into
  the rotate_half order), q/k/v always biased, head_dim = hidden_size / heads;
- Glm4vMoeForConditionalGeneration (and Glm46V with a `glm4v_moe_text` config): GLM-4.5's MoE
  decoder (glm4_moe.py), rotating in rotate_half order.

Everything between them is Qwen2-VL's path (qwen2_vl.py): the processor's grid per image
(Glm4vProcessor: each image's <|image|> expanded to its grid's tokens between <|begin_of_image|>
and <|end_of_image|>, which stay text), pad values from the image's content, the encoder cache,
M-RoPE positions from each image's grid (model/executor/mrope.py: transformers'
Glm4vModel.get_rope_index places images as Qwen2-VL's does: its tokens at start + (t, row, column),
the text after it at start + max(rows, columns)). Text alone has all three positions equal: plain
RoPE. Videos are not served.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.models.glm4 import Glm4ForCausalLM
from radixlm.model.models.glm4_moe import Glm4MoeForCausalLM
from radixlm.model.models.qwen2_vl import Qwen2VLForConditionalGeneration

DEFAULT_MROPE_SECTION = [8, 12, 12]  # transformers' Glm4vTextRotaryEmbedding's


def _with_mrope(config: Any) -> None:
    """The text config's rope parameters as transformers runs them: M-RoPE sections, sectioned."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.setdefault("mrope_section", list(DEFAULT_MROPE_SECTION))
    if params.get("mrope_interleaved"):
        raise ValueError(
            "text_config.rope_parameters.mrope_interleaved: GLM-4V's M-RoPE is sectioned"
        )
    config.rope_parameters = params


class Glm4vTextForCausalLM(Glm4ForCausalLM):
    """The dense decoder of Glm4vForConditionalGeneration (`glm4v_text`)."""

    def check_rope(self, config: Any) -> None:
        heads = config.hidden_size // config.num_attention_heads
        head_dim = getattr(config, "head_dim", None)
        if head_dim is not None and head_dim != heads:  # transformers' attention ignores it
            raise ValueError(
                f"text_config.head_dim {head_dim}: GLM-4V's attention heads are hidden_size /"
                f" num_attention_heads ({heads})"
            )
        _with_mrope(config)

    def qkv_bias(self, config: Any) -> bool:
        return True  # Glm4vTextAttention's q/k/v always have a bias


class Glm4vMoeTextForCausalLM(Glm4MoeForCausalLM):
    """The MoE decoder of Glm4vMoeForConditionalGeneration (`glm4v_moe_text`)."""

    def build_model(self, config: Any) -> nn.Module:
        if getattr(config, "use_qk_norm", False):
            raise ValueError("text_config.use_qk_norm: GLM-4.5V's attention has no q/k norms")
        _with_mrope(config)
        return super().build_model(config)


class Glm4vForConditionalGeneration(Qwen2VLForConditionalGeneration):
    TEXT_MODELS = {"glm4v_text": Glm4vTextForCausalLM, "glm4v_moe_text": Glm4vMoeTextForCausalLM}
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.visual.", "visual."),
    )
    TOWERS = {
        "glm4v_vision": ("glm4v.modeling_glm4v", "Glm4vVisionModel"),
        "glm4v_moe_vision": ("glm4v_moe.modeling_glm4v_moe", "Glm4vMoeVisionModel"),
    }

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        vision, text = config.vision_config, config.text_config
        if vision.model_type not in self.TOWERS:
            raise ValueError(
                f"vision_config.model_type {vision.model_type!r} is not supported"
                f" ({', '.join(self.TOWERS)})"
            )
        if vision.out_hidden_size != text.hidden_size:
            raise ValueError(
                f"vision_config.out_hidden_size {vision.out_hidden_size} must equal the decoder's"
                f" hidden_size {text.hidden_size}"
            )
        # transformers ties the head by the top level's tie_word_embeddings, not the text config's
        text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self._build_text(config)
        self.visual = self._tower_class(vision)._from_config(vision)

    @classmethod
    def _tower_class(cls, vision_config: Any) -> type:
        import importlib

        module, name = cls.TOWERS[vision_config.model_type]
        return getattr(importlib.import_module(f"transformers.models.{module}"), name)
