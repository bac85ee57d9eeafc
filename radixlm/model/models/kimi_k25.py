"""Kimi-K2.5 (HF Kimi_K25ForConditionalGeneration: moonshotai/Kimi-K2.5 / K2.6's weights, in their
released layout or transformers' module names): the MoonViT vision tower (transformers'
Kimi_K25VisionModel, the checkpoint's weights: a conv patch embedding, a learned position grid
bicubically resampled to each image's patch grid, 2-D axial RoPE, bidirectional attention within
each image, a final LayerNorm, then the merge_kernel_size (2 x 2) patches of each merged token
gathered), the projector (Kimi_K25MultimodalProjection: LayerNorm over each patch, the kernel's
patches concatenated, a two-layer GELU MLP) and a DeepSeek-V3 decoder (radixlm's
DeepseekV3ForCausalLM: MLA + MoE).

The processor (Kimi_K25Processor for images only, engine/hf_processors.py, with radixlm's PIL image
processor, engine/kimi_k25_image.py) resizes each image to its own patch grid and expands the
prompt's <|media_pad|> into grid_h * grid_w / merge^2 copies: each image is one MultimodalItem (its
patches and image_grid_thw), its features replacing its run of <|media_pad|> as HF's masked_scatter
does; positions stay the decoder's plain 1-D ones. Videos (<|kimi_k25_video_placeholder|>) are not
served.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.deepseek_v2 import DeepseekV3ForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration


class Kimi_K25ForConditionalGeneration(LlavaForConditionalGeneration):
    TEXT_MODELS = {"deepseek_v3": DeepseekV3ForCausalLM}
    # transformers' layout (model.vision_tower.*, model.mm_projector.*, model.language_model.*,
    # lm_head.*) -> this module's names.
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.mm_projector.", "mm_projector."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        from transformers.models.kimi_k25.modeling_kimi_k25 import (
            Kimi_K25MultimodalProjection,
            Kimi_K25VisionModel,
        )

        check_config(config)
        # transformers ties lm_head to the embeddings by the top-level tie_word_embeddings (True
        # unless a config says otherwise), whatever text_config's says: the decoder follows it.
        config.text_config.tie_word_embeddings = bool(config.tie_word_embeddings)
        self._build_text(config)
        self.vision_tower = Kimi_K25VisionModel._from_config(config.vision_config)
        self.mm_projector = Kimi_K25MultimodalProjection(config)

    def param_name(self, name: str) -> str:
        return super().param_name(released_name(name)[0])

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The released layout (what transformers' save_pretrained writes too) renamed to
        transformers' module names, MoonViT's fused wqkv split into q / k / v with q's and k's rows
        taken out of their interleaved (complex) RoPE order, as transformers' kimi_k25 conversion
        mapping does; then LLaVA's loader."""
        vision = self.config.vision_config

        def renamed():
            for name, tensor in weights:
                name, qkv = released_name(name)
                if not qkv:
                    yield name, tensor
                    continue
                for part, t in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
                    if part != "v_proj":
                        t = rope_rows(t, vision.num_attention_heads)
                    yield name.replace(".wqkv.", f".attn.{part}."), t

        super().load_weights(renamed())

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """The images' patches as one packed sequence through MoonViT (its attention keeps each
        image to itself: cu_seqlens from image_grid_thw), the projector, then per image
        [grid_h * grid_w / merge^2, hidden] (HF Kimi_K25Model.get_image_features)."""
        weight = self.mm_projector.in_proj.weight
        pixels = torch.cat([it.pixel_values for it in items]).to(
            device=weight.device, dtype=weight.dtype
        )
        grids = torch.stack([it.extra["image_grid_thw"] for it in items]).to(weight.device)
        pooled = self.vision_tower(pixels, grid_thw=grids).pooler_output
        feats = self.mm_projector(pooled).squeeze(1)
        kh, kw = self.vision_tower.merge_kernel_size
        return list(feats.split((grids[:, 1:].prod(-1) // (kh * kw)).tolist()))


# The released checkpoint's names (moonshotai/Kimi-K2.5's remote code; transformers writes them
# too) -> transformers' module names: its conversion_mapping's "kimi_k25" renames, in its order.
_VISION_LAYER = re.compile(
    r"^vision_tower\.encoder\.blocks\.(\d+)\.(norm0|norm1|mlp\.fc0|mlp\.fc1|wo)\."
)
_VISION_LAYER_NEW = {
    "norm0": "norm1",
    "norm1": "norm2",
    "mlp.fc0": "mlp.fc1",
    "mlp.fc1": "mlp.fc2",
    "wo": "attn.proj",
}
_RENAMES = (
    (re.compile(r"^language_model\.model\."), "model.language_model."),
    (re.compile(r"^language_model\.lm_head\."), "lm_head."),
    (
        re.compile(r"^vision_tower\.patch_embed\.pos_emb\.weight$"),
        "model.vision_tower.patch_embed.pos_emb.position_embeddings",
    ),
    (re.compile(r"^vision_tower\.encoder\."), "model.vision_tower."),
    (re.compile(r"^mm_projector\.proj\.0\."), "model.mm_projector.in_proj."),
    (re.compile(r"^mm_projector\.proj\.2\."), "model.mm_projector.out_proj."),
    (re.compile(r"^mm_projector\."), "model.mm_projector."),
    (re.compile(r"\.blocks\."), ".layers."),
)


def released_name(name: str) -> tuple[str, bool]:
    """(transformers' name of a released-layout tensor, whether it is MoonViT's fused wqkv);
    transformers' own names pass unchanged."""
    m = _VISION_LAYER.match(name)
    if m:
        name = (
            f"vision_tower.encoder.blocks.{m.group(1)}.{_VISION_LAYER_NEW[m.group(2)]}."
            + name[m.end() :]
        )
    for pattern, new in _RENAMES:
        name = pattern.sub(new, name, count=1)
    return name, ".wqkv." in name


def rope_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """q's or k's rows (a weight or a bias) from the released per-head interleaved RoPE pairs
    (x0, y0, x1, y1, ...) to transformers' halves (x0, x1, ..., y0, y1, ...): its
    PermuteForRope."""
    half = t.shape[0] // heads // 2
    return t.reshape(heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()


def check_config(config: Any) -> None:
    """The fields HF's Kimi-K2.5 could not run with, or radixlm does not serve, refused by name."""
    vision = config.vision_config  # the decoder: _build_text (DeepSeek-V3 only)
    kernel = list(vision.merge_kernel_size)
    if len(kernel) != 2 or min(kernel) < 1:
        raise ValueError(f"vision_config.merge_kernel_size {kernel}: two positive sizes")
    if (
        vision.hidden_size % vision.num_attention_heads
        or (vision.hidden_size // vision.num_attention_heads) % 4
    ):
        raise ValueError(
            f"vision_config.hidden_size {vision.hidden_size} over num_attention_heads"
            f" {vision.num_attention_heads}: the head size must be a multiple of 4 (2-D RoPE)"
        )
    if config.projection_hidden_size != vision.hidden_size:
        raise ValueError(
            f"projection_hidden_size {config.projection_hidden_size}: the projector normalizes"
            f" each patch, so it must be vision_config.hidden_size ({vision.hidden_size})"
        )
