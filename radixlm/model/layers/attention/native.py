"""Attention through the native paged kernel (radixlm/kernels/csrc/attention.cpp) on CPU.

It reads K/V straight from the pool by slot (req_to_token), for extend, decode and mixed batches
alike: no gather, no per-request copy, no decode mirror, and every KV dtype of the pool. A query's
result does not depend on how the batch was cut (one extend, chunks, decode steps, neighbours), so
with int8-rounded activations (quantized linear layers) outputs stay the same under any batching.

The batch's req_to_token rows are copied when its metadata is built (at launch, on the scheduler
thread), so under overlap the worker never reads rows the scheduler is rewriting (overlap.py).

A verify batch of draft trees (ForwardBatch.tree_mask) runs on the same kernel: each new token of a
tree becomes a query of its own whose key list is its request's prefix followed by its ancestors and
itself (tree_key_rows), in position order. That list is exactly the one a decode step at the node's
place on its path reads, so the kernel (keys in fixed blocks by list position) gives a node bitwise
the decode step's result; a mask applied inside the kernel's blocks would instead shift the
ancestors' block and lane positions, and with them the sums' rounding.

A layer's sliding window (or Llama 4's attention chunk), logit soft-cap and sinks go to the kernel
per call. Over an SWATokenToKVPool (cache/swa_pool.py) a windowed layer reads its own slot space:
the rows translated once per batch; keys before a query's window may map to no slot (0, the dummy),
which the kernel gives no weight. The window is a range of key positions per query ([p - window +
1, p], or [p - p % chunk, p]); since a node's key list index is its key's position (tree_key_rows),
tree verify reads the same window as the decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec
from radixlm.model.layers.attention.bidirectional import BidiQueries, bidirectional_spans

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch
    from radixlm.model.tree_mask import TreeMask

MAX_HEAD_DIM = 512  # (Gemma 4 global layers)


def supported(spec: AttentionBackendSpec) -> str | None:
    """None where NativeCPUBackend runs spec, else why not (it reads every KV dtype, and runs
    sliding windows, logit soft-caps and attention sinks per layer)."""
    from radixlm.kernels import build

    if spec.device.type != "cpu" or spec.dtype != torch.float32:
        return "the native attention kernel runs float32 models on CPU"
    if spec.head_dim % 8 or spec.head_dim > MAX_HEAD_DIM:
        return f"head_dim {spec.head_dim} is not a multiple of 8 up to {MAX_HEAD_DIM}"
    if not build.load():
        return f"native kernels unavailable: {build.unavailable_reason()}"
    return None


@dataclass
class NativeMetadata:
    q_start: torch.Tensor  # [bs + 1] int64: first query row of each request
    seq_lens: torch.Tensor  # [bs] int64: keys (prefix + new) of each request
    kv_slots: (
        torch.Tensor
    )  # [bs, max seq_len] int64: each request's req_to_token row, copied at launch
    rows: torch.Tensor  # [bs] int64: 0..bs-1, the row of each request in kv_slots
    # kv_slots in the windowed layers' slot space (SWATokenToKVPool.translate); None: one space.
    swa_kv_slots: torch.Tensor | None = None
    # Image queries that see their whole image (Gemma 3: bidirectional.py); None: none.
    bidi: BidiQueries | None = None


class NativeCPUBackend(AttentionBackend):
    reads_swa_pool = True
    supports_bidirectional_spans = True

    def __init__(self):
        from radixlm.kernels.ops import ops

        self.ops = ops()
        self._q_starts: dict[int, torch.Tensor] = {}  # decode: arange(bs + 1), per bs
        self._rows: dict[int, torch.Tensor] = {}  # arange(bs), per bs

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        bs = fb.batch_size
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        if fb.forward_mode.is_decode():
            q_start = self._q_starts.get(bs)
            if q_start is None:
                q_start = self._q_starts[bs] = torch.arange(bs + 1, dtype=torch.int64)
        else:
            lens = fb.extend_seq_lens_cpu or [
                s - p for s, p in zip(seq_lens, fb.extend_prefix_lens_cpu or [0] * bs)
            ]
            lens = list(lens) + [1] * (
                bs - len(lens)
            )  # a MIXED batch's decode tail: one query each
            q_start = torch.zeros(bs + 1, dtype=torch.int64)
            torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0, out=q_start[1:])
        rows = self._rows.get(bs)
        if rows is None:
            rows = self._rows[bs] = torch.arange(bs, dtype=torch.int64)
        req_to_token = fb.req_to_token_pool.req_to_token
        kv_slots = req_to_token[fb.req_pool_indices, : max(seq_lens, default=0)]
        if fb.tree_mask is not None:
            md = tree_key_rows(kv_slots, seq_lens, q_start, fb.tree_mask)
        else:
            md = NativeMetadata(
                q_start=q_start,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
                kv_slots=kv_slots,
                rows=rows,
            )
        translate = getattr(fb.token_to_kv_pool, "translate", None)
        if translate is not None:  # read at launch, as the rows are
            md.swa_kv_slots = translate(md.kv_slots)
        if fb.mm_inputs:
            md.bidi = BidiQueries.of(bidirectional_spans(fb))
        fb.attn_metadata = md

    def forward_extend(self, q, k, v, layer, forward_batch):
        md: NativeMetadata = forward_batch.attn_metadata
        pool = forward_batch.token_to_kv_pool
        k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
        k_scale, v_scale = pool.get_kv_scales(layer.layer_id)
        swa = md.swa_kv_slots is not None and pool.is_swa_layer(layer.layer_id)
        slots = md.swa_kv_slots if swa else md.kv_slots
        out = self.ops.paged_attention(
            q,
            k_buf,
            v_buf,
            k_scale,
            v_scale,
            slots,
            md.rows,
            md.seq_lens,
            md.q_start,
            layer.scaling,
            layer.sliding_window_size or 0,
            layer.sinks,
            layer.logit_cap,
            layer.attention_chunk_size or 0,
        )
        bd = md.bidi
        if bd is not None:  # the image queries again, each over the keys to its image's end
            table, rows, lens = bd.keys(slots, layer.sliding_window_size or 0)
            out[bd.rows] = self.ops.paged_attention(
                q[bd.rows], k_buf, v_buf, k_scale, v_scale, table, rows, lens, bd.q_start,
                layer.scaling, 0, layer.sinks, layer.logit_cap, 0,
            )  # fmt: skip
        return out

    forward_decode = forward_extend

    def runs_fused_layers(self, forward_batch: ForwardBatch) -> bool:
        # Every batch's metadata is the ops' (NativeMetadata), but image queries that see their
        # whole image (a second attention pass) are the layers' alone.
        return forward_batch.attn_metadata.bidi is None


def tree_key_rows(
    kv_slots: torch.Tensor, seq_lens: list[int], q_start: torch.Tensor, tree: TreeMask
) -> NativeMetadata:
    """The kernel's view of a batch with draft trees: a chain request stays one request; each new
    token r of a tree request b becomes a request of one query whose keys are b's prefix, then the
    new tokens its mask row allows (its ancestors and itself, in column order = depth order)."""
    starts = q_start.tolist()
    rows, lens, q_counts, extra = [], [], [], []
    width, next_row = kv_slots.shape[1], kv_slots.shape[0]
    for b, seq_len in enumerate(seq_lens):
        n = starts[b + 1] - starts[b]
        if tree.is_causal(b):
            rows.append(b)
            lens.append(seq_len)
            q_counts.append(n)
            continue
        prefix, block = seq_len - n, tree.blocks_cpu[b]
        keys = kv_slots.new_zeros(n, width)
        keys[:, :prefix] = kv_slots[b, :prefix]
        r_idx, c_idx = block.nonzero(as_tuple=True)
        at = block.cumsum(1)[r_idx, c_idx] - 1  # a key's place among its row's allowed new tokens
        keys[r_idx, prefix + at] = kv_slots[b, prefix + c_idx]
        extra.append(keys)
        rows.extend(range(next_row, next_row + n))
        next_row += n
        lens.extend((prefix + block.sum(1)).tolist())
        q_counts.extend([1] * n)
    q = torch.zeros(len(q_counts) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(q_counts, dtype=torch.int64), 0, out=q[1:])
    return NativeMetadata(
        q_start=q,
        seq_lens=torch.tensor(lens, dtype=torch.int64),
        kv_slots=torch.cat([kv_slots] + extra),
        rows=torch.tensor(rows, dtype=torch.int64),
    )
