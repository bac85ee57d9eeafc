"""What a multimodal model over a hybrid text model (recurrent + attention layers) tells the engine:
its language model's KV layers and recurrent state, and that it is hybrid. A mixin before the VLM
base class (Qwen3.5-VL, LFM2-VL)."""

from __future__ import annotations

import dataclasses

import torch

from radixlm.cache.state_pool import StateSpec
from radixlm.model.traits import ModelTraits


class HybridTextMixin:
    def traits(self) -> ModelTraits:
        return dataclasses.replace(
            super().traits(), num_kv_layers=self.num_kv_layers, is_hybrid=True
        )

    @property
    def num_kv_layers(self) -> int:
        return self.language_model.num_kv_layers

    def state_specs(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> list[list[StateSpec]]:
        return self.language_model.state_specs(conv_dtype, ssm_dtype)
