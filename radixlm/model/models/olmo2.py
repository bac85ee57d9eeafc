"""OLMo 2 (Olmo2ForCausalLM): OLMo 3's blocks (models/olmo3.py: q / k norms over the whole
projection, each branch normalized after it and before it joins the stream) with full attention on
every layer and one RoPE for all of them."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import get_rope
from radixlm.model.models.llama import LlamaForCausalLM, get_head_dim
from radixlm.model.models.olmo3 import Olmo3DecoderLayer


class Olmo2Model(DecoderStack):
    residual_stream = False  # the layers add their normalized branches to the stream themselves

    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        self.embed_tokens = self.stage_embedding(config)
        rope = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: Olmo3DecoderLayer(config, i, rope)
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))


class Olmo2ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        return Olmo2Model(config)
