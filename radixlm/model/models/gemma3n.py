"""Gemma 3n's text model (Gemma3nForCausalLM, and the language model of
Gemma3nForConditionalGeneration: google/gemma-3n-E2B / E4B as released).

Shared with Gemma 4 (gemma4.py): the attention (q/k/v RMS-normed per head, v without a weight,
scale 1, a RoPE base per layer type, sliding windows), the last `num_kv_shared_layers` layers
reading an earlier layer's KV, the per-layer inputs (PLE), norms as x * w and soft-capped logits.
New in Gemma 3n, as HF's modeling_gemma3n.py computes them:
- AltUp: the stream is `altup_num_inputs` copies of the hidden state ([tokens, A, hidden], sent
  between pipeline stages flattened). The embedding is projected into the others at its RMS; each
  layer predicts every copy from a router-weighted mix of them, runs on the active (first) one,
  and corrects every copy by the layer's innovation; at the end the copies are projected back to
  the RMS of the first and averaged.
- Laurel: a low-rank residual branch beside the attention (their sum scaled by 1/sqrt(2)).
- Activation sparsity: on the layers `activation_sparsity_pattern` names, the MLP's gate keeps
  only what lies above mean + std * Phi^-1(sparsity) of its row (a Gaussian top-k).
- The per-layer input gates the active copy's output and joins copies 1.. (not the first).
- Per-layer MLP widths (`intermediate_size` a list), and token ids past
  `vocab_size_per_layer_input` (audio / image soft tokens) take row 0 of the per-layer table.
The vision (timm MobileNetV5) and audio towers are not run: their tensors are skipped at load
and a request with an image or audio part is refused before it reaches the model.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.distributed.parallel_state import get_tp_group
from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.linear import Linear
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.gemma2 import gemma_act
from radixlm.model.models.gemma3 import LAYER_TYPES, rope_params_of
from radixlm.model.models.gemma4 import (
    Gemma4Attention,
    Gemma4ForCausalLM,
    Gemma4Model,
    kv_source_layers,
)

# Config fields HF's Gemma 3n has that this module runs only at these values.
_FIXED = {
    "altup_active_idx": 0,  # (every release; HF adds the per-layer branch to copies 1.. anyway)
    "attn_logit_softcapping": None,
}


def _check_config(config: Any) -> None:
    for field, value in _FIXED.items():
        got = getattr(config, field, value)
        if got != value:
            raise ValueError(f"Gemma 3n {field} {got!r} is not supported (only {value!r})")
    n = config.num_hidden_layers
    if not getattr(config, "hidden_size_per_layer_input", 0):
        raise ValueError("Gemma 3n hidden_size_per_layer_input must be > 0 (its layers gate by it)")
    if int(config.altup_num_inputs) < 1:
        raise ValueError(f"Gemma 3n altup_num_inputs {config.altup_num_inputs} must be >= 1")
    for field in ("activation_sparsity_pattern", "intermediate_size"):
        value = getattr(config, field)
        if isinstance(value, (list, tuple)) and len(value) != n:
            raise ValueError(f"Gemma 3n {field} has {len(value)} entries for {n} layers")
    sparsity = config.activation_sparsity_pattern or [0.0] * n
    if any(not 0.0 <= s < 1.0 for s in sparsity):
        raise ValueError(f"Gemma 3n activation_sparsity_pattern {sparsity}: each in [0, 1)")
    if any(s > 0 for s in sparsity) and get_tp_group().world_size > 1:
        # the Gaussian top-k takes the statistics of the whole gate row, which TP would split
        raise ValueError(
            "Gemma 3n activation_sparsity_pattern > 0 needs each gate row whole: tp_size 1 only"
        )


def _per_layer(value: Any, layer_id: int) -> Any:
    return value[layer_id] if isinstance(value, (list, tuple)) else value


def _rms_matched(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """x rescaled to the RMS `target` (HF's AltUp (un)embedding projections)."""
    magnitude = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * target / magnitude


class Gemma3nMLP(nn.Module):
    """Gemma's GELU-gated MLP; with sparsity > 0 the gate is cut below mean + std * Phi^-1(s)."""

    def __init__(self, config: Any, layer_id: int):
        super().__init__()
        hidden, inter = config.hidden_size, _per_layer(config.intermediate_size, layer_id)
        self.inter = inter
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter] * 2, bias=False)
        self.down_proj = RowParallelLinear(inter, hidden, bias=False, what="intermediate_size")
        self.act_fn = gemma_act(config)
        sparsity = float(_per_layer(config.activation_sparsity_pattern or 0.0, layer_id))
        # HF: Normal(0, 1).icdf(s) in float32 (erfinv(2s - 1) * sqrt(2), computed alike here on
        # the CPU: the model may be built on the meta device), cast to the activations' dtype. A
        # GGUF gives the converter's multipliers themselves (activation_sparsity_scale).
        s = torch.tensor(sparsity, dtype=torch.float32, device="cpu")
        icdf = float(torch.erfinv(2 * s - 1) * math.sqrt(2))
        scales = getattr(config, "activation_sparsity_scale", None)
        if scales is not None:
            icdf = float(scales[layer_id])
        self.std_multiplier = icdf if sparsity > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.std_multiplier is None:
            return self.down_proj(self.act_fn(gate_up))
        gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
        mult = torch.tensor(self.std_multiplier, dtype=gate.dtype, device=gate.device)
        mean = torch.mean(gate, dim=-1, keepdim=True)
        std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
        gate = F.relu(gate - (mean + std * mult))
        return self.down_proj(F.gelu(gate, approximate=self.act_fn.approximate) * up)


class Gemma3nLaurel(nn.Module):
    """Learned augmented residual: x + norm(right(left(x)))."""

    def __init__(self, config: Any):
        super().__init__()
        self.linear_left = Linear(config.hidden_size, config.laurel_rank)
        self.linear_right = Linear(config.laurel_rank, config.hidden_size)
        self.post_laurel_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class Gemma3nAltUp(nn.Module):
    """AltUp's predict / correct over the copies, x: [tokens, A, hidden] (HF's [A, ..., hidden])."""

    def __init__(self, config: Any):
        super().__init__()
        a, hidden = int(config.altup_num_inputs), config.hidden_size
        self.num = a
        self.correct_output_scale = nn.Parameter(torch.zeros(hidden), requires_grad=False)
        self.correction_coefs = Linear(a, a)
        self.prediction_coefs = Linear(a, a * a)
        self.modality_router = Linear(hidden, a)
        self.router_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.router_input_scale = hidden**-1.0

    def _modalities(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(self.router_input_scale, dtype=x.dtype, device=x.device)
        routed = self.modality_router(self.router_norm(x) * scale)
        return torch.tanh(routed.float()).type_as(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Copy j := x_j + sum_i C[j, i] x_i, C from the router on the active copy."""
        coefs = self.prediction_coefs(self._modalities(x[:, 0].contiguous()))
        return (torch.matmul(coefs.view(-1, self.num, self.num), x) + x).type_as(x)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """Copy i := prediction_i + (activated - prediction_0) * (1 + c_i)."""
        coefs = self.correction_coefs(self._modalities(activated)) + 1.0
        innovation = (activated - predictions[:, 0]).unsqueeze(1)
        return (innovation * coefs.unsqueeze(-1) + predictions).type_as(activated)

    def scale_corrected(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.correct_output_scale
        return (x.type_as(scale) * scale).type_as(x)


class Gemma3nDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding, kv_layer: int):
        super().__init__()
        eps, hidden, ple = (
            config.rms_norm_eps,
            config.hidden_size,
            config.hidden_size_per_layer_input,
        )
        self.self_attn = Gemma4Attention(config, layer_id, rotary_emb, kv_layer)
        self.mlp = Gemma3nMLP(config, layer_id)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)
        self.altup = Gemma3nAltUp(config)
        self.laurel = Gemma3nLaurel(config)
        self.correct_scale = bool(config.altup_correct_scale)
        self.per_layer_input_gate = Linear(hidden, ple)
        self.per_layer_projection = Linear(ple, hidden)
        self.post_per_layer_input_norm = RMSNorm(hidden, eps)
        self.approximate = self.mlp.act_fn.approximate

    def forward(self, positions, streams, forward_batch, per_layer_input, shared_kv):
        """streams: [tokens, A, hidden] -> the same, corrected."""
        predictions = self.altup.predict(streams)
        active = predictions[:, 0].contiguous()
        normed = self.input_layernorm(active)
        laurel = self.laurel(normed)
        attn = self.self_attn(positions, normed, forward_batch, shared_kv)
        gated = active + self.post_attention_layernorm(attn)
        out = (gated + laurel) / math.sqrt(2)
        out = out + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(out)))
        corrected = self.altup.correct(predictions, out)
        first = corrected[:, 0]
        if self.correct_scale:
            first = self.altup.scale_corrected(first)
        gate = F.gelu(self.per_layer_input_gate(first), approximate=self.approximate)
        branch = self.post_per_layer_input_norm(self.per_layer_projection(gate * per_layer_input))
        corrected[:, 1:] += branch.unsqueeze(1)
        return corrected


class Gemma3nModel(Gemma4Model):
    """Gemma 4's stack (KV sharing, per-layer inputs, stage hand-over) over AltUp's copies."""

    def __init__(self, config: Any):
        DecoderStack.__init__(self)
        _check_config(config)
        self.kv_source = kv_source_layers(config)
        shared = [s for i, s in enumerate(self.kv_source) if s != i]
        self.init_stack(config, fused=False, last_from=min(shared) if shared else None)
        n, hidden = config.num_hidden_layers, config.hidden_size
        self.num_copies = a = int(config.altup_num_inputs)
        self.hidden = hidden
        self.hidden_size = a * hidden  # the stream between stages: the copies, flattened
        self.ple_dim = config.hidden_size_per_layer_input
        self.ple_vocab = config.vocab_size_per_layer_input
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden)
        self.normalizer = math.sqrt(hidden)
        ropes = {
            t: RotaryEmbedding(
                config.head_dim, config.max_position_embeddings, rope_params_of(config, t)
            )
            for t in LAYER_TYPES
            if t in config.layer_types
        }
        self.layers = self.stage_layers(
            n,
            lambda i: Gemma3nDecoderLayer(
                config, i, ropes[config.layer_types[i]], self.kv_source[i]
            ),
        )
        self.norm = self.on_last(lambda: RMSNorm(hidden, config.rms_norm_eps))
        self.embed_tokens_per_layer = VocabParallelEmbedding(self.ple_vocab, n * self.ple_dim)
        self.per_layer_model_projection = Linear(hidden, n * self.ple_dim)
        self.per_layer_projection_norm = RMSNorm(self.ple_dim, config.rms_norm_eps)
        self.altup_projections = self.on_first(
            lambda: nn.ModuleList(Linear(hidden, hidden) for _ in range(1, a))
        )
        self.altup_unembed_projections = self.on_last(
            lambda: nn.ModuleList(Linear(hidden, hidden) for _ in range(1, a))
        )

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        # HF: ids outside the per-layer table (soft tokens) read its row 0
        in_table = (input_ids >= 0) & (input_ids < self.ple_vocab)
        return super().per_layer_inputs(torch.where(in_table, input_ids, 0), embeds)

    def embed(self, input_ids, input_embeds):
        hidden = super().embed(input_ids, None)
        if not self.pp.is_first:
            return hidden  # (a later stage embeds for its per-layer inputs only)
        target = torch.mean(hidden**2, dim=-1, keepdim=True) ** 0.5
        copies = [hidden] + [_rms_matched(p(hidden), target) for p in self.altup_projections]
        return torch.stack(copies, dim=1).view(hidden.shape[0], -1)

    def run_layer(self, i, positions, hidden, fb, residual):
        streams = hidden.view(hidden.shape[0], self.num_copies, self.hidden)
        out = self.layers[i](positions, streams, fb, self._ple[:, i], self._shared_kv)
        return out.view(hidden.shape[0], -1), None

    def final_norm(self, hidden, residual):
        self._ple, self._shared_kv = None, {}  # (this forward's, not kept past it)
        streams = hidden.view(hidden.shape[0], self.num_copies, self.hidden)
        first = streams[:, 0]
        target = torch.mean(first**2, dim=-1, keepdim=True) ** 0.5
        copies = [first] + [
            _rms_matched(p(streams[:, i + 1].contiguous()), target)
            for i, p in enumerate(self.altup_unembed_projections)
        ]
        return self.norm(torch.mean(torch.stack(copies), dim=0))


class Gemma3nForCausalLM(Gemma4ForCausalLM):
    """Gemma3nForCausalLM, and Gemma3nForConditionalGeneration's language model (its
    model.language_model.* tensors; the towers' skipped by Gemma 4's load hook)."""

    def build_model(self, config: Any) -> nn.Module:
        return Gemma3nModel(config)
