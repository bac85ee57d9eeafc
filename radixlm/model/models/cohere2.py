"""Command R7B / Command A (Cohere2ForCausalLM; transformers' modeling_cohere2 is the reference).

What differs from Llama:
- parallel blocks: one LayerNorm (mean-centred, no bias: layers/norm.LayerNorm) feeds both the
  attention and the MLP, and the stream adds both outputs: x + attn(ln(x)) + mlp(ln(x));
- config.layer_types: the sliding layers attend a window (config.sliding_window) and rotate q/k,
  the global ones attend everything with no RoPE at all (smollm3.NoRope);
- HF rotates interleaved pairs: load_weights turns q/k rows into the rotate_half order
  (rotary.interleaved_to_rotate_half; the global layers' too, harmless without RoPE);
- the logits times logit_scale; the LM head tied to the embeddings by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.norm import LayerNorm
from radixlm.model.layers.rotary import get_rope, interleaved_to_rotate_half
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, get_head_dim
from radixlm.model.models.smollm3 import NoRope

LAYER_TYPES = ("sliding_attention", "full_attention")


class Cohere2DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: nn.Module):
        super().__init__()
        bias = bool(getattr(config, "attention_bias", False))
        self.self_attn = LlamaAttention(config, layer_id, rotary_emb, qkv_bias=bias, qk_norm=False)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, positions, hidden, forward_batch, residual=None):
        """Both branches added here: no residual rides along (-> (stream, None))."""
        x = self.input_layernorm(hidden)
        return hidden + self.self_attn(positions, x, forward_batch) + self.mlp(x), None


class Cohere2Model(DecoderStack):
    residual_stream = False

    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        self.embed_tokens = self.stage_embedding(config)
        rope, no_rope = get_rope(get_head_dim(config), config), NoRope()
        # HF: RoPE where the layer has a window (sliding_window None: none anywhere)
        windowed = [
            t == "sliding_attention" and config.sliding_window is not None
            for t in config.layer_types
        ]
        self.layers = self.stage_layers(
            config.num_hidden_layers,
            lambda i: Cohere2DecoderLayer(config, i, rope if windowed[i] else no_rope),
        )
        self.norm = self.on_last(lambda: LayerNorm(config.hidden_size, eps=config.layer_norm_eps))


class Cohere2ForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":  # the MLP is SiluAndMul
            raise ValueError(f"Cohere2ForCausalLM: hidden_act {act!r} is not supported (silu)")
        types = list(getattr(config, "layer_types", None) or [])
        if len(types) != config.num_hidden_layers or set(types) - set(LAYER_TYPES):
            raise ValueError(
                f"Cohere2ForCausalLM: layer_types must give each of the {config.num_hidden_layers}"
                f" layers one of {', '.join(LAYER_TYPES)}, got {types}"
            )
        return Cohere2Model(config)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) * float(self.config.logit_scale)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._rotate_half_qk(weights))

    def _rotate_half_qk(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        head_dim = get_head_dim(self.config)
        for name, tensor in weights:
            if ".self_attn.q_proj." in name or ".self_attn.k_proj." in name:
                tensor = interleaved_to_rotate_half(tensor, head_dim)
            yield name, tensor
