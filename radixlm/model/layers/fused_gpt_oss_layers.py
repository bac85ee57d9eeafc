"""All decoder layers of gpt-oss in one native op (radixlm/kernels/csrc/gpt_oss_layers.cpp), as
fused_layers.py does for the Llama family: a bs-1 step of the 20B shape is ~24 x 40 torch calls
through Python (as one op: 0.82x the step in paired runs, docs/benchmarks.md). The op calls the
kernels the Python layers call, in their order, so outputs are bitwise the same.

It applies on CPU in float32 when every attention projection is quantized (biases kept), the
experts run on the native experts' op (GptOssExperts.fused: MXFP4 in the released GGUFs), the
router is float32 and the attention backend's metadata is the op's; windowed layers read the
windowed pool's slots (cache/swa_pool.py) as the Python layers do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from radixlm.model.layers.fused_layers import LayerKV, quantized_segments, stack_rope_applies

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


@dataclass
class _Layer:
    tensors: list[torch.Tensor]  # in gpt_oss_layers.cpp's order
    fmts: list[int]
    seg_counts: list[int]  # qkv's, o's
    ints: list[int]  # window (0: none), w13's and w2's formats, top k


@dataclass
class FusedGptOssLayers:
    layers: list[_Layer]
    cos_sin: torch.Tensor
    dims: tuple[int, int, int]  # heads, KV heads, head dim
    eps: float
    scaling: float
    alpha: float
    limit: float
    _args: dict = field(default_factory=dict, repr=False)

    def args(self, start: int, end: int) -> tuple[list, list, list, list]:
        """(weights, fmts, seg_counts, layer_ints) of layers [start, end), flattened once."""
        got = self._args.get((start, end))
        if got is None:
            part = self.layers[start:end]
            got = self._args[(start, end)] = (
                [t for layer in part for t in layer.tensors],
                [f for layer in part for f in layer.fmts],
                [c for layer in part for c in layer.seg_counts],
                [i for layer in part for i in layer.ints],
            )
        return got

    def runs(self, fb: ForwardBatch, segments: list[tuple[int, int]]) -> bool:
        return fb.attn_backend.runs_fused_layers(fb)

    def run(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        start: int = 0,
        end: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the embeddings [tokens, hidden], or the stream entering layer `start` (as
        fused_layers.run_fused_layers) -> (layer end - 1's output, the residual stream)."""
        from radixlm.kernels.ops import ops

        end = len(self.layers) if end is None else end
        pool, md = fb.token_to_kv_pool, fb.attn_metadata
        kv = LayerKV.of(fb, start, end)
        # As RadixAttention and the native backend decide per layer: the windowed pool's slots
        # where the pool has one and keeps this layer's KV there.
        swa_slots = kv.swa_kv_slots
        in_swa = [int(swa_slots is not None and pool.is_swa_layer(i)) for i in range(start, end)]
        swa_loc = kv.swa_out_cache_loc if any(in_swa) else fb.out_cache_loc
        residual = torch.empty_like(hidden)
        out = ops().gpt_oss_layers(
            hidden,
            residual,
            positions,
            self.cos_sin,
            *self.args(start, end),
            in_swa,
            kv.k_bufs,
            kv.v_bufs,
            kv.k_scales,
            kv.v_scales,
            fb.out_cache_loc,
            swa_loc,
            md.kv_slots,
            md.kv_slots if swa_slots is None else swa_slots,
            md.rows,
            md.seq_lens,
            md.q_start,
            *self.dims,
            self.eps,
            self.scaling,
            self.alpha,
            self.limit,
        )
        return out, residual


def _layer(layer: Any, eps: set) -> _Layer | None:
    attn, moe = layer.self_attn, layer.mlp
    ra = attn.attn
    experts, router = moe.experts, moe.router
    segments = [quantized_segments(attn.qkv_proj), quantized_segments(attn.o_proj)]
    if (
        any(s is None for s in segments)
        or attn.qk_norm
        or attn.qkv_proj.bias is None
        or attn.o_proj.bias is None
        or ra.sinks is None
        or ra.attention_chunk_size is not None
        or ra.logit_cap
        or not experts.fused
        or router.weight.dtype != torch.float32
        or router.bias.dtype != torch.float32
    ):
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    eps.update(n.variance_epsilon for n in norms)
    f, b = experts.fused, experts.fused_bias
    tensors = [n.weight for n in norms] + [attn.qkv_proj.bias, attn.o_proj.bias, ra.sinks]
    tensors += [w for segs in segments for w, _ in segs]
    tensors += [router.weight, router.bias, f["w13"].data, b["b13"], f["w2"].data, b["b2"]]
    formats = [f["w13"].fmt.kernel_id, f["w2"].fmt.kernel_id]
    ints = [ra.sliding_window_size or 0, *formats, router.top_k]
    return _Layer(
        tensors,
        [fmt for segs in segments for _, fmt in segs],
        [len(segs) for segs in segments],
        ints,
    )


def build_fused_gpt_oss_layers(model: Any) -> FusedGptOssLayers | None:
    """The op's arguments for a GptOssModel (models/gpt_oss.py), or None where it does not apply."""
    if not stack_rope_applies(model):
        return None
    layers = list(model.layers)
    rope = model.rotary_emb
    eps: set = set()
    parts = []
    for layer in layers:
        part = _layer(layer, eps)
        if part is None:
            return None
        parts.append(part)
    a = layers[0].self_attn
    experts = layers[0].mlp.experts
    if len(eps) != 1 or a.head_dim % 8:
        return None
    return FusedGptOssLayers(
        parts,
        rope.cos_sin_cache,
        (a.num_heads, a.num_kv_heads, a.head_dim),
        eps.pop(),
        a.attn.scaling,
        experts.alpha,
        experts.limit,
    )
