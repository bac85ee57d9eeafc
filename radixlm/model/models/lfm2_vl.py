"""LFM2-VL (HF Lfm2VlForConditionalGeneration: LiquidAI's LFM2-VL-450M / 1.6B / 3B): a SigLIP2
NaFlex vision tower (transformers' Siglip2VisionModel, the checkpoint's weights: patch rows of any
grid, the learned position grid resampled to each tile's, a pixel attention mask over the
padding), the projector (pixel unshuffle by `downsample_factor`, LayerNorm, Linear / GELU / Linear:
transformers' Lfm2VlMultiModalProjector) and radixlm's LFM2 decoder (lfm2.py: short convolutions
beside attention, so the model is hybrid: the runner asks it num_kv_layers and state_specs).

The processor (Lfm2VlProcessor with radixlm's image processor, engine/lfm2_vl_image.py) writes
<|image_start|>, per tile <|img_row_r_col_c|> and its run of <image>, <|img_thumbnail|> and the
thumbnail's run, <|image_end|> (a small image: one run, no markers): every tile and the thumbnail
is one MultimodalItem, its patch rows and its spatial shape, encoded and cached on its own. Pad
values come from the tile's content, so the hybrid prefix cache's snapshots never serve another
image.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.models.hybrid_vlm import HybridTextMixin
from radixlm.model.models.lfm2 import Lfm2ForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration


def check_config(config: Any) -> None:
    """Refuse, by name, the fields this model (and HF's) cannot run."""
    from transformers.activations import ACT2FN

    vision = config.vision_config
    if vision.model_type != "siglip2_vision_model":
        raise ValueError(
            f"vision_config.model_type {vision.model_type!r}: LFM2-VL takes its SigLIP2 NaFlex"
            " tower (siglip2_vision_model)"
        )
    factor = config.downsample_factor
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
        raise ValueError(f"downsample_factor {factor!r}: a positive integer")
    if config.projector_hidden_act not in ACT2FN:
        raise ValueError(
            f"projector_hidden_act {config.projector_hidden_act!r}: not an activation"
            " transformers knows"
        )
    side = int(vision.num_patches**0.5)
    if side * side != vision.num_patches:
        raise ValueError(
            f"vision_config.num_patches {vision.num_patches}: the position grid is square"
        )
    vocab = config.text_config.vocab_size
    if not 0 <= config.image_token_id < vocab:
        raise ValueError(
            f"image_token_id {config.image_token_id}: outside the vocabulary ({vocab})"
        )


class Lfm2VlForConditionalGeneration(HybridTextMixin, LlavaForConditionalGeneration):
    TEXT_MODELS = {"lfm2": Lfm2ForCausalLM}
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )

    def __init__(self, config: Any):
        nn.Module.__init__(self)
        from transformers.models.lfm2_vl.modeling_lfm2_vl import Lfm2VlMultiModalProjector
        from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionModel

        check_config(config)
        # transformers ties the head by the top level's tie_word_embeddings (LFM2-VL's: tied)
        config.text_config.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        self._build_text(config)
        self.vision_tower = Siglip2VisionModel(config.vision_config)
        self.multi_modal_projector = Lfm2VlMultiModalProjector(config)

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """One batch of tiles through SigLIP2 (patch rows padded to the batch's longest, masked)
        and the projector: per tile, [(rows / f) * (columns / f), hidden] (HF
        Lfm2VlModel.get_image_features)."""
        weight = self.multi_modal_projector.linear_1.weight
        shapes = torch.stack([it.extra["spatial_shapes"] for it in items]).to(weight.device)
        counts = [int(h) * int(w) for h, w in shapes.tolist()]
        longest = max(counts)
        dim = items[0].pixel_values.shape[-1]
        pixels = torch.zeros(len(items), longest, dim, dtype=weight.dtype, device=weight.device)
        mask = torch.zeros(len(items), longest, dtype=torch.long, device=weight.device)
        for i, (it, n) in enumerate(zip(items, counts)):
            pixels[i, :n] = it.pixel_values[:n].to(device=weight.device, dtype=weight.dtype)
            mask[i, :n] = 1
        hidden = self.vision_tower(
            pixel_values=pixels, pixel_attention_mask=mask, spatial_shapes=shapes
        ).last_hidden_state
        out = []
        for i, (h, w) in enumerate(shapes.tolist()):
            grid = hidden[i, : h * w].reshape(1, h, w, -1)
            out.append(self.multi_modal_projector(grid).flatten(0, 2))
        return out
