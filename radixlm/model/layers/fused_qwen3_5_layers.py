"""All decoder layers of a Qwen3.5 (dense, MoE, and Qwen3-Next, whose layers are the same) in one
native op (radixlm/kernels/csrc/qwen3_5_layers.cpp), as fused_layers.py does for the Llama family:
a bs-1 step of the 0.8B shape is ~1,500 small torch calls through Python (18 Gated DeltaNet
layers, 6 gated attention layers), a few milliseconds of a ~27 ms step. The op calls the kernels
the Python layers call, in their order, so outputs are bitwise the same.

It applies on CPU in float32 when every projection is quantized (in_proj_ba excepted: the model
keeps it float, FLOAT_WEIGHTS), each MLP is dense or Qwen3.5-MoE's sparse block on the native
experts op with a quantized shared expert (one rank's experts; the op runs the shared expert
inside the experts' op, moe.cpp), the linear-attention backend is the native one and the attention
backend's metadata is the op's; a forward that must take state snapshots inside its tokens
(ForwardBatch.state_tracks) runs the Python layers, which cut the recurrence there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixlm.model.layers.fused_layers import (
    kv_and_metadata,
    quantized_segments,
    stack_rope_applies,
)

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


@dataclass
class FusedQwen3_5Layers:
    weights: list[torch.Tensor]  # per layer: its tensors (qwen3_5_layers.cpp), then its segments
    fmts: list[int]  # per segment
    seg_counts: list[int]  # per layer: 4 projections
    layer_is_linear: list[int]
    mlp_is_moe: list[int]
    expert_loads: list[torch.Tensor]  # of the sparse MLPs, counted in place
    moe_ints: list[int]  # per sparse MLP: w13's and w2's formats, top k, renormalize
    state_layer_ids: list[int]  # of the linear-attention layers, in order
    cos_sin: torch.Tensor
    # heads, KV heads, head dim, key heads, value heads, key / value head dims, tiled
    dims: list[int]
    eps: float
    scaling: float

    def runs(self, fb: ForwardBatch, segments: list[tuple[int, int]]) -> bool:
        """The whole stack at once (decoder_stack.FusedStack), where runs_fused allows."""
        return len(segments) == 1 and runs_fused(fb)

    def run(
        self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return run_fused_qwen3_5_layers(self, hidden, positions, fb)


def _dense_mlp_segments(mlp: Any, dense_mlp: type) -> list | None:
    if type(mlp) is not dense_mlp:
        return None
    projs = [mlp.gate_up_proj, mlp.down_proj]
    if any(p.bias is not None for p in projs):
        return None
    return [quantized_segments(p) for p in projs]


def _sparse_mlp(block: Any, dense_mlp: type) -> tuple[list, list, list] | None:
    """(tensors, the shared expert's segments, moe ints) of a SparseMoeBlock the op runs as its
    Python forward does: one rank's experts on the native op, a quantized shared expert."""
    from radixlm.model.layers.moe import native
    from radixlm.model.layers.moe.expert_dispatch import LocalExperts
    from radixlm.model.layers.moe.moe_block import SparseMoeBlock

    if type(block) is not SparseMoeBlock or block.ep_size != 1:
        return None
    if type(block.dispatch) is not LocalExperts or block.shared_expert is None:
        return None
    if block.w13 is None:
        block._views()
    shared = _dense_mlp_segments(block.shared_expert, dense_mlp)
    gates = (block.gate.weight, block.shared_expert_gate.weight)
    if block._experts is not native.run or shared is None:
        return None
    if any(g.dtype != torch.float32 for g in gates) or block.expert_load.dtype != torch.int64:
        return None
    tensors = [gates[0], block.w13.data, block.w2.data, gates[1]]
    spec = block.spec
    ints = [block.w13.fmt.kernel_id, block.w2.fmt.kernel_id, spec.top_k, int(spec.renormalize)]
    return tensors, shared, ints


def _linear_layer(layer: Any, eps: set) -> tuple[list, list] | None:
    """(tensors, segments of its 4 projections) of a Gated DeltaNet layer, or None."""
    gdn = layer.linear_attn
    ba = gdn.in_proj_ba
    if (
        ba.qweight is not None
        or ba.weight is None
        or ba.weight.dtype != torch.float32
        or any(p.bias is not None for p in (gdn.in_proj_qkvz, gdn.out_proj, ba))
        or gdn.conv1d.bias is not None
    ):
        return None
    eps.add(gdn.norm.eps)
    tensors = [
        ba.weight,
        gdn.conv1d.weight.view(gdn.conv_dim, gdn.kernel_size),
        gdn.A_log.float().contiguous(),
        gdn.dt_bias.float().contiguous(),
        gdn.norm.weight.float().contiguous(),
    ]
    return tensors, [quantized_segments(gdn.in_proj_qkvz), quantized_segments(gdn.out_proj)]


def _attention_layer(layer: Any, eps: set) -> tuple[list, list] | None:
    attn = layer.self_attn
    ra = attn.attn
    if (
        attn.qkv_proj.bias is not None
        or attn.o_proj.bias is not None
        or ra.sliding_window_size is not None
        or ra.attention_chunk_size is not None
        or ra.logit_cap
        or ra.sinks is not None
    ):
        return None
    eps.update((attn.q_norm.variance_epsilon, attn.k_norm.variance_epsilon))
    tensors = [attn.q_norm.kernel_scale(), attn.k_norm.kernel_scale()]
    return tensors, [quantized_segments(attn.qkv_proj), quantized_segments(attn.o_proj)]


def build_fused_qwen3_5_layers(model: Any, dense_mlp: type) -> FusedQwen3_5Layers | None:
    """The op's arguments for a Qwen3_5Model (models/qwen3_5.py), or None where it does not apply.
    dense_mlp: the MLP class the op runs (gate_up_proj, SiLU and mul, down_proj: models/llama.py's
    LlamaMLP, passed in: layers never import models)."""
    if not stack_rope_applies(model):
        return None
    layers = list(model.layers)
    rope = model.rotary_emb
    weights, fmts, counts, kinds, state_ids = [], [], [], [], []
    moe_kinds, expert_loads, moe_ints = [], [], []
    eps: set = set()
    attn = gdn = None

    def add_segments(segments: list) -> None:
        for segs in segments:
            weights.extend(w for w, _ in segs)
            fmts.extend(f for _, f in segs)
            counts.append(len(segs))

    for layer in layers:
        part = _linear_layer(layer, eps) if layer.is_linear else _attention_layer(layer, eps)
        dense = _dense_mlp_segments(layer.mlp, dense_mlp)
        sparse = None if dense is not None else _sparse_mlp(layer.mlp, dense_mlp)
        if part is None or (dense is None and sparse is None):
            return None
        tensors, segments = part
        mlp_segments = dense if dense is not None else sparse[1]
        if any(s is None for s in segments + mlp_segments):
            return None
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        eps.update(n.variance_epsilon for n in norms)
        weights += [n.kernel_scale() for n in norms] + tensors
        add_segments(segments)
        if sparse is not None:  # the router, the experts, the shared gate: before the shared expert
            weights += sparse[0]
            moe_ints += sparse[2]
            expert_loads.append(layer.mlp.expert_load)
        moe_kinds.append(int(sparse is not None))
        add_segments(mlp_segments)
        kinds.append(int(layer.is_linear))
        if layer.is_linear:
            gdn = layer.linear_attn
            state_ids.append(gdn.state_layer_id)
        else:
            attn = layer.self_attn
    eps.add(model.norm.variance_epsilon)
    if len(eps) != 1 or attn is None or gdn is None or attn.head_dim % 8:
        return None
    dims = [attn.num_heads, attn.num_kv_heads, attn.head_dim]
    dims += [gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, int(gdn.tiled)]
    return FusedQwen3_5Layers(
        weights, fmts, counts, kinds, moe_kinds, expert_loads, moe_ints, state_ids,
        rope.cos_sin_cache, dims, eps.pop(), attn.attn.scaling,
    )  # fmt: skip


def runs_fused(fb: ForwardBatch) -> bool:
    """Whether this batch's layers can run as the op: the native recurrences and attention
    metadata, no state snapshot inside the forward's tokens, no draft tree, no LoRA."""
    from radixlm.model.layers.linear_attn.native_backend import NativeLinearAttnBackend

    tracks = fb.state_tracks
    return (
        isinstance(fb.linear_attn_backend, NativeLinearAttnBackend)
        and not (tracks and any(tracks))
        and fb.state_drafts is None  # draft trees run level by level (draft_states.py)
        and not fb.uses_lora
        and fb.attn_backend.runs_fused_layers(fb)
        and getattr(fb.attn_metadata, "swa_kv_slots", None) is None
    )


def run_fused_qwen3_5_layers(
    f: FusedQwen3_5Layers, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: the embeddings [tokens, hidden] -> (the last layer's output, the residual stream)."""
    from radixlm.kernels.ops import ops
    from radixlm.model.layers.linear_attn.segments import request_lens

    layers = [fb.state_pool.layer(i) for i in f.state_layer_ids]
    residual = torch.empty_like(hidden)
    out = ops().qwen3_5_layers(
        hidden,
        residual,
        positions,
        f.cos_sin,
        f.weights,
        f.fmts,
        f.seg_counts,
        f.layer_is_linear,
        f.mlp_is_moe,
        f.expert_loads,
        f.moe_ints,
        [s["conv"] for s in layers],
        [s["ssm"] for s in layers],
        fb.req_pool_indices,
        request_lens(fb),
        *kv_and_metadata(fb),
        f.dims,
        f.eps,
        f.scaling,
    )
    return out, residual
