"""Gemma 4 (text: Gemma4ForCausalLM, and the language model of Gemma4ForConditionalGeneration).

What differs from Gemma 3:
- Per layer type, its own attention shape: sliding layers of `head_dim`, global layers of
  `global_head_dim` with their own KV head count (config.per_layer_config), so the KV pool keeps
  each layer's shape (KVLayout.layer_shapes). Global layers may take V = K's projection
  (`attention_k_eq_v`).
- q, k and v each RMS-normed per head (v without a weight), attention scale 1, and "proportional"
  RoPE on the global layers (a quarter of the frequencies, at the whole head's spacing).
- The last `num_kv_shared_layers` layers compute no K/V: each reads the KV of the last earlier
  layer of its type (its RadixAttention names that layer, and stores nothing).
- Per-layer inputs (PLE): a second embedding of the tokens, [vocab, layers x P], plus a
  projection of the embedded tokens, give each layer a P-vector that gates a residual branch.
- Norms are x * w (not Gemma's 1 + w); each layer's output is scaled by a learned scalar; the
  final logits are soft-capped where the config says.
- Optionally (the A4B MoE models) a routed expert block beside each layer's dense MLP
  (gemma4_moe.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention.radix_attention import RadixAttention
from radixlm.model.layers.linear import Linear
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.norm import RMSNorm, UnscaledRMSNorm
from radixlm.model.layers.parallel_linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.gemma2 import Gemma2ForCausalLM, gemma_act
from radixlm.model.models.gemma3 import LAYER_TYPES, rope_params_of
from radixlm.model.models.gemma4_moe import Gemma4MoeBlock
from radixlm.model.models.llama import LlamaMLP, get_sliding_window
from radixlm.model.traits import ModelTraits

# Checkpoint tensors radixlm does not run (the vision and audio towers of the multimodal release).
SKIPPED_PREFIXES = (
    "model.vision_tower.",
    "model.embed_vision.",
    "model.audio_tower.",
    "model.embed_audio.",
)


def layer_shape(config: Any, layer_id: int) -> tuple[int, int]:
    """(kv_heads, head_dim) of layer layer_id: config.per_layer_config where transformers built
    one, else the global layers' global_head_dim / num_global_key_value_heads."""
    per_layer = getattr(config, "per_layer_config", None)
    if per_layer is not None:
        cfg = per_layer[layer_id]
        return cfg.num_key_value_heads, cfg.head_dim
    if config.layer_types[layer_id] == "full_attention":
        heads = getattr(config, "num_global_key_value_heads", None)
        dim = getattr(config, "global_head_dim", None)
        return heads or config.num_key_value_heads, dim or config.head_dim
    return config.num_key_value_heads, config.head_dim


def kv_source_layers(config: Any) -> list[int]:
    """Per layer, the layer whose KV it reads: itself, or for the last num_kv_shared_layers the
    last earlier non-shared layer of the same type (HF's kv_sharing_modes "store" layers)."""
    n, shared = config.num_hidden_layers, getattr(config, "num_kv_shared_layers", 0) or 0
    first = n - shared
    source = list(range(n))
    for i in range(first, n):
        own = [j for j in range(first) if config.layer_types[j] == config.layer_types[i]]
        if not own:
            raise ValueError(
                f"Gemma 4 layer {i} ({config.layer_types[i]}) shares KV, but no earlier layer of"
                " its type computes any (num_kv_shared_layers too large for layer_types)"
            )
        source[i] = own[-1]
    return source


def _per_head(norm: RMSNorm, x: torch.Tensor, head_dim: int) -> torch.Tensor:
    return norm(x.reshape(-1, head_dim)).view(x.shape[0], -1)


class Gemma4Attention(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding, kv_layer: int):
        super().__init__()
        self.layer_type = config.layer_types[layer_id]
        kv_heads, self.head_dim = layer_shape(config, layer_id)
        self.num_heads = config.num_attention_heads
        self.shared = kv_layer != layer_id  # reads layer kv_layer's KV, computes none
        self.k_eq_v = bool(getattr(config, "attention_k_eq_v", False)) and (
            self.layer_type == "full_attention"
        )
        q, kv = self.num_heads * self.head_dim, kv_heads * self.head_dim
        self.sizes = [q] if self.shared else [q, kv] if self.k_eq_v else [q, kv, kv]
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = MergedColumnParallelLinear(
            config.hidden_size, self.sizes, bias=bias, what="num_attention_heads * head_dim"
        )
        self.o_proj = RowParallelLinear(q, config.hidden_size, bias=bias)
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(self.head_dim, eps)
        if not self.shared:
            self.k_norm = RMSNorm(self.head_dim, eps)
            self.v_norm = UnscaledRMSNorm(self.head_dim, eps)
        self.rotary_emb = rotary_emb
        self.attn = RadixAttention(
            self.num_heads,
            self.head_dim,
            1.0,  # (the q/k norms set the logits' scale)
            kv_heads,
            kv_layer,
            sliding_window_size=get_sliding_window(config, layer_id),
        )

    def forward(self, positions, hidden, forward_batch: ForwardBatch, shared_kv: dict):
        """shared_kv: layer type -> (k, v) of this batch's tokens from the layer a later shared
        layer reads (written by that layer, read by the shared ones)."""
        d = self.head_dim
        parts = self.qkv_proj(hidden).split(self.sizes, dim=-1)
        q = _per_head(self.q_norm, parts[0], d)
        if self.shared:
            k, v = shared_kv[self.layer_type]
            q, _ = self.rotary_emb(positions, q, q.new_zeros(q.shape[0], d))
        else:
            raw_v = parts[1] if self.k_eq_v else parts[2]
            v = _per_head(self.v_norm, raw_v, d)
            k = _per_head(self.k_norm, parts[1], d)
            q, k = self.rotary_emb(positions, q, k)
            shared_kv[self.layer_type] = (k, v)
        out = self.attn(q, k, v, forward_batch, save_kv_cache=not self.shared)
        return self.o_proj(out)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding, kv_layer: int):
        super().__init__()
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.self_attn = Gemma4Attention(config, layer_id, rotary_emb, kv_layer)
        wide = bool(getattr(config, "use_double_wide_mlp", False)) and self.self_attn.shared
        self.mlp = LlamaMLP(
            hidden, config.intermediate_size * (2 if wide else 1), act_fn=gemma_act(config)
        )
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)
        self.moe = Gemma4MoeBlock(config) if getattr(config, "enable_moe_block", False) else None
        if self.moe is not None:  # HF's names for the MoE branch's norms
            self.post_feedforward_layernorm_1 = RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(hidden, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(hidden, eps)
        self.ple_dim = getattr(config, "hidden_size_per_layer_input", 0) or 0
        if self.ple_dim:
            self.per_layer_input_gate = Linear(hidden, self.ple_dim)
            self.per_layer_projection = Linear(self.ple_dim, hidden)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, positions, hidden, forward_batch, per_layer_input, shared_kv):
        branch = self.self_attn(positions, self.input_layernorm(hidden), forward_batch, shared_kv)
        hidden = hidden + self.post_attention_layernorm(branch)
        branch = self.mlp(self.pre_feedforward_layernorm(hidden))
        if self.moe is not None:
            routed = self.moe(hidden, self.pre_feedforward_layernorm_2(hidden))
            branch = self.post_feedforward_layernorm_1(branch)
            branch = branch + self.post_feedforward_layernorm_2(routed)
        hidden = hidden + self.post_feedforward_layernorm(branch)
        if self.ple_dim:
            gate = F.gelu(self.per_layer_input_gate(hidden), approximate="tanh")
            branch = self.per_layer_projection(gate * per_layer_input)
            hidden = hidden + self.post_per_layer_input_norm(branch)
        return hidden * self.layer_scalar


class Gemma4Model(DecoderStack):
    residual_stream = False

    def __init__(self, config: Any):
        super().__init__()
        self.kv_source = kv_source_layers(config)
        # A stage reads only the KV it wrote: the shared layers stay on the stage of the layers
        # whose KV they read (the last one, from the first such layer on).
        shared = [s for i, s in enumerate(self.kv_source) if s != i]
        self.init_stack(config, fused=False, last_from=min(shared) if shared else None)
        n, hidden = config.num_hidden_layers, config.hidden_size
        self.ple_dim = getattr(config, "hidden_size_per_layer_input", 0) or 0
        # Each stage computes the per-layer inputs from the token ids itself (the same ops on the
        # same weights: bitwise the first stage's), so only the stream crosses between stages.
        self.embed_tokens = (
            VocabParallelEmbedding(config.vocab_size, hidden)
            if self.ple_dim
            else self.stage_embedding(config)
        )
        self.normalizer = math.sqrt(hidden)  # HF: sqrt(hidden) in the weights' dtype
        max_pos = config.max_position_embeddings
        ropes = {}
        for t in LAYER_TYPES:
            if t in config.layer_types:
                dim = layer_shape(config, config.layer_types.index(t))[1]
                ropes[t] = RotaryEmbedding(dim, max_pos, rope_params_of(config, t))
        self.layers = self.stage_layers(
            n,
            lambda i: Gemma4DecoderLayer(
                config, i, ropes[config.layer_types[i]], self.kv_source[i]
            ),
        )
        self.norm = self.on_last(lambda: RMSNorm(hidden, config.rms_norm_eps))
        if self.ple_dim:
            self.embed_tokens_per_layer = VocabParallelEmbedding(
                config.vocab_size_per_layer_input, n * self.ple_dim
            )
            self.per_layer_model_projection = Linear(hidden, n * self.ple_dim)
            self.per_layer_projection_norm = RMSNorm(self.ple_dim, config.rms_norm_eps)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[tokens, layers, P]: the tokens' own per-layer embedding and the embedded tokens'
        projection, each scaled as HF scales them, averaged by 1/sqrt(2)."""
        n, p = len(self.layers), self.ple_dim
        own = self.embed_tokens_per_layer(input_ids) * torch.tensor(
            math.sqrt(p), dtype=embeds.dtype
        )
        proj = self.per_layer_model_projection(embeds) * (embeds.shape[-1] ** -0.5)
        proj = self.per_layer_projection_norm(proj.reshape(-1, p)).view(-1, n, p)
        return (proj + own.view(-1, n, p)) * (2.0**-0.5)

    def embed(self, input_ids, input_embeds):
        hidden = self.embed_tokens(input_ids)
        hidden = hidden * torch.tensor(self.normalizer, dtype=hidden.dtype)
        self._ple = self.per_layer_inputs(input_ids, hidden) if self.ple_dim else None
        return hidden

    def prepare(self, input_ids, positions, fb):
        # per forward: the per-layer inputs (a later stage embeds the ids for them), and the K/V
        # the shared layers read
        if not self.pp.is_first:
            self._ple = None
            if self.ple_dim:
                self.embed(input_ids, None)
        self._shared_kv: dict = {}
        return super().prepare(input_ids, positions, fb)

    def run_layer(self, i, positions, hidden, fb, residual):
        layer_input = self._ple[:, i] if self._ple is not None else None
        return self.layers[i](positions, hidden, fb, layer_input, self._shared_kv), None

    def final_norm(self, hidden, residual):
        self._ple, self._shared_kv = None, {}  # (this forward's, not kept past it)
        return self.norm(hidden)


class Gemma4ForCausalLM(Gemma2ForCausalLM):
    stacked_params_mapping = Gemma2ForCausalLM.stacked_params_mapping

    def __init__(self, config: Any):
        # a ConditionalGeneration's config nests the text model's (text_config)
        super().__init__(config.get_text_config())

    def build_model(self, config: Any) -> nn.Module:
        return Gemma4Model(config)

    def traits(self) -> ModelTraits:
        return dataclasses.replace(super().traits(), kv_shared_layers=tuple(self.kv_shared_layers))

    @property
    def kv_shared_layers(self) -> list[int]:
        """The layers that keep no KV of their own (kv_layout.layer_shapes)."""
        return [i for i, s in enumerate(self.model.kv_source) if s != i]

    def param_name(self, name: str) -> str:
        # (a pipeline stage picks its tensors by this name: a ConditionalGeneration's too)
        return super().param_name(name.replace("model.language_model.", "model.", 1))

    def load_weights(self, weights) -> None:
        self._quantized_experts: set[str] = set()
        super().load_weights(self._hf_names(weights))

    def _num_shards(self, param_name: str) -> int:
        if param_name in getattr(self, "_quantized_experts", ()):
            return 0  # loaded as blocks (Gemma4MoeBlock.set_quantized), not into the parameter
        return super()._num_shards(param_name)

    def _hf_names(self, weights):
        shared = set(self.kv_shared_layers)
        for name, t in weights:
            name = name.replace("model.language_model.", "model.")  # a ConditionalGeneration's
            if name.startswith(SKIPPED_PREFIXES):
                continue
            name = name.replace(".router.", ".moe.router.").replace(".experts.", ".moe.")
            if ".self_attn." in name and name.split(".self_attn.")[1].startswith(
                ("k_proj", "v_proj", "k_norm", "v_norm")
            ):
                if int(name.split(".")[2]) in shared:  # computed nowhere (HF ignores them too)
                    continue
            if isinstance(t, ExpertWeights):  # a GGUF's experts
                if not t.quantized:
                    t = t.data
                else:  # kept in their blocks
                    owner, _, kind = name.rpartition(".")
                    self.get_submodule(owner).set_quantized(kind, t)
                    self._quantized_experts.add(name)
                    continue
            yield name, t
