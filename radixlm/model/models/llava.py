"""LLaVA (HF LlavaForConditionalGeneration): a CLIP ViT vision tower, a two-layer MLP projector and
a Llama-family decoder. The image embeddings replace the pad values of each image span
(model/mm_embed.py); everything after the embedding is the decoder's own forward, KV and all.

The vision tower is transformers' CLIPVisionModel (its weights from the checkpoint): it runs once
per image, in the scheduler process, batched across the requests of a step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.mm_embed import EncoderCache, embed_with_images
from radixlm.model.models.llama import LlamaForCausalLM, MistralForCausalLM
from radixlm.model.models.qwen2 import Qwen2ForCausalLM
from radixlm.model.traits import ModelTraits, ServedModel, tp_sharded

TEXT_MODELS = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM}
DEFAULT_ENCODER_CACHE_BYTES = 64 * 2**20


class LlavaProjector(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        from transformers.activations import ACT2FN

        layers = (
            1 if isinstance(config.vision_feature_layer, int) else len(config.vision_feature_layer)
        )
        bias = getattr(config, "multimodal_projector_bias", True)
        hidden = config.text_config.hidden_size
        self.linear_1 = nn.Linear(config.vision_config.hidden_size * layers, hidden, bias=bias)
        self.act = ACT2FN[config.projector_hidden_act]
        self.linear_2 = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(ServedModel):
    modalities = ("text", "image")
    TEXT_MODELS = TEXT_MODELS  # the decoders a family takes, by the text config's model_type

    def __init__(self, config: Any):
        super().__init__()
        from transformers import CLIPVisionModel

        self._build_text(config)
        if config.vision_config.model_type != "clip_vision_model":
            raise ValueError(
                f"LLaVA with a {config.vision_config.model_type!r} vision tower is not supported"
                " (CLIP)"
            )
        tower = CLIPVisionModel(config.vision_config)
        self.vision_tower = getattr(tower, "vision_model", tower)  # transformers < 5 nests it
        self.multi_modal_projector = LlavaProjector(config)

    def traits(self) -> ModelTraits:
        return ModelTraits(modalities=self.modalities, encoder_cache=self.encoder_cache)

    def _build_text(self, config: Any) -> None:
        """The decoder (radixlm's), the vocabulary and the encoder cache."""
        self.config = config
        text = config.text_config
        if text.model_type not in self.TEXT_MODELS:
            raise ValueError(
                f"text_config.model_type {text.model_type!r}: {type(self).__name__} with that"
                " decoder is not supported "
                f"({', '.join(self.TEXT_MODELS)})"
            )
        self.language_model = self.TEXT_MODELS[text.model_type](text)
        if tp_sharded(self.language_model):
            raise ValueError(
                f"{type(self).__name__} runs with --tp-size 1 (the image embeddings enter on one"
                " rank; pipeline stages work)"
            )
        self.vocab_size = text.vocab_size
        self.encoder_cache = EncoderCache(DEFAULT_ENCODER_CACHE_BYTES)

    def embed_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The text tokens' input embeddings in an extend with images (the decoder's lookup)."""
        return self.language_model.model.embed_tokens(input_ids)

    def encode_images(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """One batch through the vision tower and the projector: per image, [tokens, hidden]."""
        dev = self.multi_modal_projector.linear_1.weight.device
        dtype = self.vision_tower.embeddings.patch_embedding.weight.dtype
        pixels = torch.stack([it.pixel_values for it in items]).to(device=dev, dtype=dtype)
        layer = self.config.vision_feature_layer
        states = self.vision_tower(pixels, output_hidden_states=True).hidden_states
        feats = (
            states[layer]
            if isinstance(layer, int)
            else torch.cat([states[i] for i in layer], dim=-1)
        )
        if self.config.vision_feature_select_strategy == "default":
            feats = feats[:, 1:]  # the CLS token's position is not an image token
        return list(self.multi_modal_projector(feats))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        lm = self.language_model
        if not lm.model.pp.is_first:  # the images entered on the first stage
            return lm.model(input_ids, positions, forward_batch)
        embeds = embed_with_images(
            forward_batch,
            input_ids,
            self.embed_text,
            self.vocab_size,
            self.encoder_cache,
            self.encode_images,
        )
        if (
            embeds is None
        ):  # no image span here; a draft may copy a pad value (never sampled: it is rejected)
            input_ids = input_ids.clamp(max=self.vocab_size - 1)
        return lm.model(input_ids, positions, forward_batch, input_embeds=embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden_states)

    # Both HF layouts (transformers >= 4.52's model.language_model.* and the older
    # language_model.model.*; CLIPVisionModel's vision_model.*) -> this module's names.
    NAME_MAP = (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("vision_tower.vision_model.", "vision_tower."),
    )

    def _map_name(self, name: str) -> str:
        for old, new in self.NAME_MAP:
            if name.startswith(old):
                name = new + name[len(old) :]
        if name.startswith("lm_head."):
            name = "language_model." + name
        return name

    def param_name(self, name: str) -> str:
        """The parameter checkpoint tensor `name` fills (the decoder's after its own renaming)."""
        name = self._map_name(name)
        if name.startswith("language_model."):
            inner = name[len("language_model.") :]
            return "language_model." + self.language_model.param_name(inner)
        return name

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        text, unknown = [], []
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            name = self._map_name(name)
            if name.startswith("language_model."):
                text.append((name[len("language_model.") :], tensor))
            elif name in params:
                if params[name].shape != tensor.shape:
                    raise ValueError(
                        f"{name}: expected shape {tuple(params[name].shape)}, got"
                        f" {tuple(tensor.shape)}"
                    )
                params[name].data = tensor.to(
                    device=params[name].device, dtype=params[name].dtype
                ).contiguous()
                loaded.add(name)
            elif "position_ids" not in name:
                unknown.append(name)
        self.language_model.load_weights(text)
        missing = [n for n in params if not n.startswith("language_model.") and n not in loaded]
        if unknown or missing:
            raise ValueError(
                f"weights do not match {type(self).__name__}: missing {missing[:8]}, unknown"
                f" {unknown[:8]}"
            )
