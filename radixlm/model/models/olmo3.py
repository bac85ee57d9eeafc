"""OLMo 3 (Olmo3ForCausalLM): OLMo-2 blocks with sliding-window attention on most layers.

What differs from Llama: q_norm / k_norm are RMSNorms over the whole q / k projection (all heads
at once, before RoPE), a layer has no pre-norms but normalizes each branch's output before it joins
the residual stream (post_attention_layernorm, post_feedforward_layernorm), and RoPE is kept per
layer type in config.rope_parameters (gemma3.rope_params_of; long-context checkpoints scale the
full-attention layers only). Windows per layer come from config.layer_types (get_sliding_window).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.gemma3 import rope_params_of
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, get_head_dim


class Olmo3Attention(LlamaAttention):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding):
        super().__init__(config, layer_id, rotary_emb, qkv_bias=False, qk_norm=False)
        if self.num_heads != config.num_attention_heads:
            # The norms' statistics span every head: a rank holding some heads cannot compute them.
            raise ValueError("Olmo3 runs with tp_size 1 (its q/k norms span all heads)")
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(self.q_size, eps=eps)
        self.k_norm = RMSNorm(self.kv_size, eps=eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Olmo3DecoderLayer(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        self_attn: nn.Module | None = None,
    ):
        """self_attn: another family's attention in these post-norm layers (EXAONE 4's per-head
        q/k norms); default OLMo's."""
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = self_attn or Olmo3Attention(config, layer_id, rotary_emb)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps=eps)

    def forward(self, positions, hidden, forward_batch, residual=None):
        """Post-norms added to the stream here: no residual rides along (-> (stream, None))."""
        hidden = hidden + self.post_attention_layernorm(
            self.self_attn(positions, hidden, forward_batch)
        )
        return hidden + self.post_feedforward_layernorm(self.mlp(hidden)), None


class Olmo3Model(DecoderStack):
    residual_stream = False

    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        self.embed_tokens = self.stage_embedding(config)
        head_dim, max_pos = get_head_dim(config), config.max_position_embeddings
        ropes = {
            t: RotaryEmbedding(head_dim, max_pos, rope_params_of(config, t))
            for t in set(config.layer_types)
        }
        self.layers = self.stage_layers(
            config.num_hidden_layers,
            lambda i: Olmo3DecoderLayer(config, i, ropes[config.layer_types[i]]),
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))


class Olmo3ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        return Olmo3Model(config)
