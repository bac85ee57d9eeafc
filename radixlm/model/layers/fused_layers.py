"""All decoder layers of a Llama-family model in one native op (radixlm/kernels/csrc/layers.cpp).

Used on CPU when every projection is quantized (one segment, or one per format: a Q4_K_M file's
qkv holds Q4_K q/k beside a Q6_K v) and the attention backend runs it for the
batch (AttentionBackend.runs_fused_layers: the op reads the native backend's metadata): a
bs-1 step is ~400 small ops, and Python plus torch's dispatcher cost ~10 ms of it. The op calls the
same kernels as the Python layers in the same order, so outputs are bitwise the same; anything it
does not cover (Qwen3's q/k norms, windows, soft-caps, sinks, float projections or segments,
biases outside qkv) keeps the Python path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor
from radixlm.model.layers.rotary import (
    MRotaryEmbedding,
)  # three positions per token: not the op's table rows

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class LlamaLayersView(Protocol):
    """What the builder reads of a Llama-family model (models/llama.py: LlamaModel), typed here so
    this module never imports the model."""

    layers: (
        nn.ModuleList
    )  # LlamaDecoderLayer: self_attn (qkv/o, rotary_emb, attn), mlp, the two norms
    norm: nn.Module


@dataclass
class FusedLayers:
    weights: list[
        torch.Tensor
    ]  # per layer: input norm, post norm, the segments of qkv, o, gate_up, down
    fmts: list[int]  # per segment
    seg_counts: list[int]  # per layer: segments of qkv, o, gate_up, down
    qkv_bias: list[torch.Tensor]  # per layer, or empty
    cos_sin: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    scaling: float
    # Per layer: where its weights and formats start in `weights` / `fmts` (and one past the last
    # layer).
    weight_starts: list[int] = field(default_factory=list)
    fmt_starts: list[int] = field(default_factory=list)
    _segments: dict = field(default_factory=dict, repr=False)

    def layers(self, start: int, end: int) -> FusedLayers:
        """The op's arguments for layers [start, end) only (a run in segments:
        model/hidden_capture.py)."""
        if (start, end) == (0, len(self.seg_counts) // 4):
            return self
        part = self._segments.get((start, end))
        if part is None:
            ws, fs = self.weight_starts, self.fmt_starts
            part = self._segments[(start, end)] = FusedLayers(
                self.weights[ws[start] : ws[end]],
                self.fmts[fs[start] : fs[end]],
                self.seg_counts[4 * start : 4 * end],
                self.qkv_bias[start:end] if self.qkv_bias else [],
                self.cos_sin,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.eps,
                self.scaling,
            )
        return part

    def runs(self, fb: ForwardBatch, segments: list[tuple[int, int]]) -> bool:
        """The op reads the native backend's metadata (decoder_stack.FusedStack)."""
        return fb.attn_backend.runs_fused_layers(fb)

    def run(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        start: int = 0,
        end: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """run_fused_layers on these arguments (decoder_stack.FusedStack)."""
        return run_fused_layers(self, hidden, positions, fb, start, end)


def quantized_segments(linear) -> list[tuple[torch.Tensor, int]] | None:
    """(blocks, format id) per segment, or None when the projection is not all quantized (in the
    native formats: FP8 runs a Triton GEMM)."""
    q = linear.qweight
    if not isinstance(q, QuantizedMatrix) or not all(
        isinstance(s.weight, QuantizedTensor) for s in q.segments
    ):
        return None
    return [(s.weight.data, s.weight.fmt.kernel_id) for s in q.segments]


def stack_rope_applies(model: Any) -> bool:
    """Whether a hybrid or MoE stack's one-op path can take this model at all: layers, float32 on
    the CPU kernels, one RoPE table of float32 rows by position (no M-RoPE)."""
    from radixlm.kernels.ops import cpu_float_ops

    rope = model.rotary_emb
    return bool(
        len(model.layers)
        and cpu_float_ops(model.norm.weight) is not None
        and not isinstance(rope, MRotaryEmbedding)
        and rope.cos_sin_cache.dtype == torch.float32
    )


def build_fused_layers(model: LlamaLayersView) -> FusedLayers | None:
    """The op's arguments for this model, or None where it does not apply."""
    from radixlm.kernels.ops import cpu_float_ops

    layers = list(model.layers)
    if not layers or cpu_float_ops(model.norm.weight) is None:
        return None
    if (
        getattr(layers[0].self_attn.o_proj, "tp_size", 1) > 1
    ):  # tensor parallel: the Python layers, all-reduce between
        return None
    weights, fmts, counts, biases = [], [], [], []
    weight_starts, fmt_starts = [], []
    for layer in layers:
        weight_starts.append(len(weights))
        fmt_starts.append(len(fmts))
        attn, mlp = layer.self_attn, layer.mlp
        projs = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        segments = [quantized_segments(p) for p in projs]
        ra = attn.attn  # the op's attention has no window, soft-cap or sinks
        if (
            attn.qk_norm
            or ra.sliding_window_size is not None
            or ra.attention_chunk_size is not None
            or ra.logit_cap
            or ra.sinks is not None
            or any(s is None for s in segments)
            or any(p.bias is not None for p in projs[1:])
        ):
            return None
        if (attn.qkv_proj.bias is not None) != (layers[0].self_attn.qkv_proj.bias is not None):
            return None
        rope = attn.rotary_emb
        if (
            rope.cos_sin_cache.dtype != torch.float32
            or attn.head_dim % 8
            or isinstance(rope, MRotaryEmbedding)
        ):
            return None
        weights += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        for segs in segments:
            weights += [w for w, _ in segs]
            fmts += [f for _, f in segs]
            counts.append(len(segs))
        if attn.qkv_proj.bias is not None:
            biases.append(attn.qkv_proj.bias)
    a = layers[0].self_attn
    eps = {layer.input_layernorm.variance_epsilon for layer in layers} | {
        layer.post_attention_layernorm.variance_epsilon for layer in layers
    }
    if len(eps) != 1:
        return None
    weight_starts.append(len(weights))
    fmt_starts.append(len(fmts))
    return FusedLayers(
        weights,
        fmts,
        counts,
        biases,
        a.rotary_emb.cos_sin_cache,
        a.num_heads,
        a.num_kv_heads,
        a.head_dim,
        eps.pop(),
        a.attn.scaling,
        weight_starts,
        fmt_starts,
    )


def run_fused_layers(
    f: FusedLayers,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    fb: ForwardBatch,
    start: int = 0,
    end: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: the embeddings [tokens, hidden], or the residual stream entering layer `start` (the
    op then starts as from an embedding: it copies the stream as the residual and norms it, bitwise
    the add + norm it would have run); -> (layer end - 1's output, residual stream)."""
    from radixlm.kernels.ops import ops

    end = len(f.seg_counts) // 4 if end is None else end
    f = f.layers(start, end)
    residual = torch.empty_like(hidden)
    out = ops().llama_layers(
        hidden,
        residual,
        positions,
        f.cos_sin,
        f.weights,
        f.fmts,
        f.seg_counts,
        f.qkv_bias,
        *kv_and_metadata(fb, start, end),
        f.num_heads,
        f.num_kv_heads,
        f.head_dim,
        f.eps,
        f.scaling,
    )
    return out, residual


def kv_and_metadata(fb: ForwardBatch, start: int = 0, end: int | None = None) -> tuple:
    """The fused ops' KV arguments for KV layers [start, end) and the batch's attention metadata
    (the native backend's): k_bufs, v_bufs, k_scales, v_scales (empty: none), out_cache_loc,
    kv_slots, rows, seq_lens, q_start."""
    pool, md = fb.token_to_kv_pool, fb.attn_metadata
    layers = slice(start, end)
    scales = (
        ([], [])
        if pool.k_scale_buffer is None
        else (pool.k_scale_buffer[layers], pool.v_scale_buffer[layers])
    )
    return (
        pool.k_buffer[layers],
        pool.v_buffer[layers],
        *scales,
        fb.out_cache_loc,
        md.kv_slots,
        md.rows,
        md.seq_lens,
        md.q_start,
    )
