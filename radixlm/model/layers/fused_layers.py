"""All decoder layers of a dense model in one native op (radixlm/kernels/csrc/layers.cpp): the Llama
family's pre-norm layers, Qwen3's q/k norms, Gemma 2 / 3's sandwich norms, GELU MLPs, windowed
layers (in either slot space of the pool) and a RoPE table per layer.

Used on CPU when every projection is quantized (one segment, or one per format: a Q4_K_M file's
qkv holds Q4_K q/k beside a Q6_K v) and the attention backend runs it for the
batch (AttentionBackend.runs_fused_layers: the op reads the native backend's metadata): a
bs-1 step is ~400 small ops, and Python plus torch's dispatcher cost ~10 ms of it. The op calls the
same kernels as the Python layers in the same order, so outputs are bitwise the same; anything it
does not cover (attention chunks, sinks, float projections or segments, biases outside qkv, other
norms or activations) keeps the Python path.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from radixlm.model.layers.activation import GeluAndMul, SiluAndMul
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor
from radixlm.model.layers.rotary import (
    MRotaryEmbedding,
)  # three positions per token: not the op's table rows

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch

# The op's flags (layers.cpp): what the layers have beyond Llama's.
QK_NORM, SANDWICH, GELU_TANH, GELU_ERF = 1, 2, 4, 8
_GELU_FLAGS = {"tanh": GELU_TANH, "none": GELU_ERF}


class LlamaLayersView(Protocol):
    """What the builder reads of a dense model (models/llama.py: LlamaModel, models/gemma2.py:
    Gemma2Model), typed here so this module never imports the model."""

    layers: nn.ModuleList  # self_attn (qkv/o, rotary_emb, attn, q/k norms), mlp, the norms
    norm: nn.Module


@dataclass
class FusedLayers:
    weights: list[torch.Tensor]  # per layer: its norms, the segments of qkv, o, gate_up, down
    fmts: list[int]  # per segment
    seg_counts: list[int]  # per layer: segments of qkv, o, gate_up, down
    qkv_bias: list[torch.Tensor]  # per layer, or empty
    cos_sin: list[torch.Tensor]  # one RoPE table for every layer, or one per layer
    windows: list[int]  # per layer (0: full attention)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    scaling: float
    logit_cap: float
    flags: int
    # Per layer: where its weights and formats start in `weights` / `fmts` (and one past the last
    # layer).
    weight_starts: list[int] = field(default_factory=list)
    fmt_starts: list[int] = field(default_factory=list)
    _segments: dict = field(default_factory=dict, repr=False)

    def layers(self, start: int, end: int) -> FusedLayers:
        """The op's arguments for layers [start, end) only (a run in segments:
        model/hidden_capture.py)."""
        if (start, end) == (0, len(self.windows)):
            return self
        part = self._segments.get((start, end))
        if part is None:
            ws, fs = self.weight_starts, self.fmt_starts
            part = self._segments[(start, end)] = FusedLayers(
                self.weights[ws[start] : ws[end]],
                self.fmts[fs[start] : fs[end]],
                self.seg_counts[4 * start : 4 * end],
                self.qkv_bias[start:end] if self.qkv_bias else [],
                self.cos_sin if len(self.cos_sin) == 1 else self.cos_sin[start:end],
                self.windows[start:end],
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.eps,
                self.scaling,
                self.logit_cap,
                self.flags,
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


def _act_flags(act: nn.Module) -> int | None:
    """The op's flag for the MLP's activation (None: one it does not run)."""
    if isinstance(act, SiluAndMul):
        return 0
    if isinstance(act, GeluAndMul):
        return _GELU_FLAGS.get(act.approximate)
    return None


def _layer_norms(layer: Any, sandwich: bool) -> list[nn.Module]:
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if sandwich:
        norms += [layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm]
    if layer.self_attn.qk_norm:
        norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
    return norms


def build_fused_layers(
    model: LlamaLayersView, forwards: Collection[Callable], sandwich: bool = False
) -> FusedLayers | None:
    """The op's arguments for this model, or None where it does not apply. forwards: the forward
    methods whose computation the op repeats (the family's decoder layer, attention and MLP): a
    layer, attention or MLP of another class (HunYuan's q/k norms after RoPE, Ministral 3's
    attention temperature) keeps the Python layers. sandwich: Gemma's layers (a norm after
    attention and one before and after the MLP: models/gemma2.py)."""
    from radixlm.kernels.ops import cpu_float_ops

    layers = list(model.layers)
    if not layers or cpu_float_ops(model.norm.weight) is None:
        return None
    if not all(
        type(m).forward in forwards for layer in layers for m in (layer, layer.self_attn, layer.mlp)
    ):
        return None
    if (
        getattr(layers[0].self_attn.o_proj, "tp_size", 1) > 1
    ):  # tensor parallel: the Python layers, all-reduce between
        return None
    first = layers[0].self_attn
    weights, fmts, counts, biases, windows, ropes = [], [], [], [], [], []
    weight_starts, fmt_starts = [], []
    eps, caps, scales, acts = set(), set(), set(), set()
    for layer in layers:
        weight_starts.append(len(weights))
        fmt_starts.append(len(fmts))
        attn, mlp = layer.self_attn, layer.mlp
        projs = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        segments = [quantized_segments(p) for p in projs]
        ra = attn.attn  # the op's attention has no attention chunks or sinks
        norms = _layer_norms(layer, sandwich)
        if (
            attn.qk_norm != first.qk_norm
            or ra.attention_chunk_size is not None
            or ra.sinks is not None
            or any(s is None for s in segments)
            or any(p.bias is not None for p in projs[1:])
            or (attn.qkv_proj.bias is not None) != (first.qkv_proj.bias is not None)
            or not all(isinstance(n, RMSNorm) for n in norms)
        ):
            return None
        rope = attn.rotary_emb
        if (
            rope.cos_sin_cache.dtype != torch.float32
            or attn.head_dim % 8
            or isinstance(rope, MRotaryEmbedding)
        ):
            return None
        weights += [n.kernel_scale() for n in norms]
        eps.update(n.variance_epsilon for n in norms)
        for segs in segments:
            weights += [w for w, _ in segs]
            fmts += [f for _, f in segs]
            counts.append(len(segs))
        if attn.qkv_proj.bias is not None:
            biases.append(attn.qkv_proj.bias)
        windows.append(ra.sliding_window_size or 0)
        ropes.append(rope.cos_sin_cache)
        caps.add(ra.logit_cap or 0.0)
        scales.add(ra.scaling)
        acts.add(_act_flags(mlp.act_fn))
    if len(eps) != 1 or len(caps) != 1 or len(scales) != 1 or len(acts) != 1 or None in acts:
        return None
    weight_starts.append(len(weights))
    fmt_starts.append(len(fmts))
    one_rope = all(r is ropes[0] for r in ropes)
    flags = acts.pop() | (QK_NORM if first.qk_norm else 0) | (SANDWICH if sandwich else 0)
    return FusedLayers(
        weights,
        fmts,
        counts,
        biases,
        ropes[:1] if one_rope else ropes,
        windows,
        first.num_heads,
        first.num_kv_heads,
        first.head_dim,
        eps.pop(),
        scales.pop(),
        caps.pop(),
        flags,
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

    end = len(f.windows) if end is None else end
    f = f.layers(start, end)
    kv = LayerKV.of(fb, start, end)
    md = fb.attn_metadata
    windowed = kv.swa_kv_slots is not None and any(f.windows)
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
        kv.k_bufs,
        kv.v_bufs,
        kv.k_scales,
        kv.v_scales,
        fb.out_cache_loc,
        kv.swa_out_cache_loc if windowed else None,
        md.kv_slots,
        kv.swa_kv_slots if windowed else None,
        md.rows,
        md.seq_lens,
        md.q_start,
        f.windows,
        f.num_heads,
        f.num_kv_heads,
        f.head_dim,
        f.eps,
        f.scaling,
        f.logit_cap,
        f.flags,
    )
    return out, residual


@dataclass
class LayerKV:
    """The pool's K/V buffers (and int8 / int4 scales: empty lists for none) of layers [start, end),
    and, where the pool keeps windowed layers in a slot space of their own (cache/swa_pool.py), that
    space's table and the new tokens' slots in it (None otherwise): what RadixAttention and the
    native backend read per layer, gathered once per forward for a one-op stack."""

    k_bufs: list[torch.Tensor]
    v_bufs: list[torch.Tensor]
    k_scales: list[torch.Tensor]
    v_scales: list[torch.Tensor]
    swa_kv_slots: torch.Tensor | None
    swa_out_cache_loc: torch.Tensor | None

    @classmethod
    def of(cls, fb: ForwardBatch, start: int, end: int) -> LayerKV:
        pool, md = fb.token_to_kv_pool, fb.attn_metadata
        swa_slots = md.swa_kv_slots
        if swa_slots is None:  # one slot space: its per-layer lists, sliced
            layers = slice(start, end)
            k_scales = pool.k_scale_buffer
            return cls(
                pool.k_buffer[layers],
                pool.v_buffer[layers],
                [] if k_scales is None else k_scales[layers],
                [] if k_scales is None else pool.v_scale_buffer[layers],
                None,
                None,
            )
        kv = [pool.get_kv_buffer(i) for i in range(start, end)]
        scales = [pool.get_kv_scales(i) for i in range(start, end)]
        scaled = bool(scales) and scales[0][0] is not None
        return cls(
            [k for k, _ in kv],
            [v for _, v in kv],
            [k for k, _ in scales] if scaled else [],
            [v for _, v in scales] if scaled else [],
            swa_slots,
            pool.translate(fb.out_cache_loc),
        )


def kv_and_metadata(fb: ForwardBatch, start: int = 0, end: int | None = None) -> tuple:
    """The fused ops' KV arguments for KV layers [start, end) of a pool with one slot space and the
    batch's attention metadata (the native backend's): k_bufs, v_bufs, k_scales, v_scales (empty:
    none), out_cache_loc, kv_slots, rows, seq_lens, q_start."""
    md = fb.attn_metadata
    kv = LayerKV.of(fb, start, fb.token_to_kv_pool.num_layers if end is None else end)
    return (
        kv.k_bufs,
        kv.v_bufs,
        kv.k_scales,
        kv.v_scales,
        fb.out_cache_loc,
        md.kv_slots,
        md.rows,
        md.seq_lens,
        md.q_start,
    )
