"""gpt-oss (GptOssForCausalLM): the Llama graph with biases on q/k/v/o, attention sinks (a learned
logit per query head in each softmax's denominator: RadixAttention's `sinks`), sliding-window and
full-attention layers alternating as config.layer_types says (get_sliding_window), one RoPE (YaRN
in the released models) for every layer, and a mixture of experts in every layer
(gpt_oss_moe.py: a biased router, biased experts with a clamped SwiGLU).

Weights: HF safetensors in float (bfloat16 / float32); the released checkpoints' MXFP4 experts are
not read yet (load_weights names their *_blocks / *_scales tensors as unknown). A GGUF's quantized
experts (MXFP4 in llama.cpp's files) stay quantized (gpt_oss_moe.py: set_quantized).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.fused_gpt_oss_layers import build_fused_gpt_oss_layers
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import VocabParallelEmbedding
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.gpt_oss_moe import GptOssSparseMoeBlock
from radixlm.model.models.llama import LlamaAttention, LlamaForCausalLM, get_head_dim
from radixlm.model.models.moe import MoeDecoderLayer


def gpt_oss_layer(config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
    attn = LlamaAttention(config, layer_id, rotary_emb, qkv_bias=True, qk_norm=False, sinks=True)
    if attn.num_heads != config.num_attention_heads:
        # The experts are not split yet and the sinks not sliced per rank.
        raise ValueError("gpt-oss runs with tp_size 1")
    return MoeDecoderLayer(config, attn, GptOssSparseMoeBlock(config))


class GptOssModel(DecoderStack):
    """The Llama graph (pre-norms, fused add + norm) over gpt-oss layers."""

    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config)
        self.embed_tokens = self.on_first(
            lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        )
        self.rotary_emb = rotary_emb = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: gpt_oss_layer(config, i, rotary_emb)
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def build_fused(self):
        """All layers in one native op where it applies (layers/fused_gpt_oss_layers.py)."""
        return build_fused_gpt_oss_layers(self)


class GptOssForCausalLM(LlamaForCausalLM):
    def build_model(self, config: Any) -> nn.Module:
        return GptOssModel(config)

    def load_weights(self, weights) -> None:
        self._quantized_experts: set[str] = set()
        super().load_weights(self._take_quantized_experts(weights))

    def _take_quantized_experts(self, weights):
        """Quantized experts go to their module's blocks; everything else on to load_weights."""
        for name, tensor in weights:
            if isinstance(tensor, ExpertWeights) and tensor.quantized:
                owner, kind = name.rsplit(".", 1)
                self.get_submodule(owner).set_quantized(kind, tensor)
                self._quantized_experts.add(name)
            else:
                yield name, tensor

    def _num_shards(self, param_name: str) -> int:
        if param_name in getattr(self, "_quantized_experts", ()):
            return 0  # loaded as blocks (set_quantized), not into the float parameter
        return super()._num_shards(param_name)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        # The sinks are read by the attention op (RadixAttention.sinks), which holds them.
        if name.endswith(".self_attn.sinks"):
            return name.replace(".self_attn.sinks", ".self_attn.attn.sinks"), None
        return super()._map_name(name)
