"""TritonAttnBackend: the Triton kernels over the paged KV pool (kernels/triton_ops/), auto's choice
on CUDA.

Every batch shape reads K/V straight from the pool by slot: EXTEND, MIXED (its decodes are extends
of one token) and TARGET_VERIFY through the extend kernel, DECODE through split-KV decode with the
shared-prefix pass (a prefix held by a group of requests read once per group; off with
--disable-shared-prefix-attention and for models with a sliding window). Sliding windows, logit
soft-capping and attention sinks are kernel options, per layer.

Metadata is built at launch on the scheduler thread from host lists (no device sync): the batch's
req_to_token rows are copied then (kv_slots), so under overlap the forward never reads rows the
scheduler is rewriting (as the native backend does). The decode groups are found on the device in
begin_forward, on the forward's thread, so a CUDA graph of the decode step computes them too.

Tree verification (speculative/draft_tree.py): a TARGET_VERIFY batch's ForwardBatch.tree_mask
(model/tree_mask.py) becomes the metadata's `custom_mask` (uint8, per request an [ext, ext]
row-major block from `mask_start[b]`, 1 = the query sees that new token; the prefix stays visible)
and the extend kernel applies it instead of causality within the extension. The kernel's sliding
window reads column positions, where a tree's nodes sit at prefix + depth: a model with a window
drafts chains on this backend (supports_tree_mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.cache.memory_pool import kv_dtype_name
from radixlm.kernels import triton_ops
from radixlm.model.host_copy import to_device
from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec

if TYPE_CHECKING:
    from radixlm.kernels.triton_ops.prefix_groups import PrefixGroups
    from radixlm.model.forward_batch import ForwardBatch

KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def supported(spec: AttentionBackendSpec) -> str | None:
    """None where TritonAttnBackend runs spec, else why not."""
    why = triton_ops.unavailable_reason(spec.device)
    if why is not None:
        return why
    if spec.kv_dtype not in KV_DTYPES:
        return f"kv_cache_dtype {kv_dtype_name(spec.kv_dtype)}: the Triton kernels read float KV"
    if spec.dtype not in KV_DTYPES:
        return f"dtype {spec.dtype}: the Triton kernels run float models"
    if spec.attention_chunk_size is not None:
        return "no chunked attention (Llama 4's: the native backend runs it)"
    if spec.head_dim > MAX_HEAD_DIM or spec.head_dim < 16:
        return f"head_dim {spec.head_dim} is outside the Triton kernels' 16..{MAX_HEAD_DIM}"
    return None


@dataclass
class TritonMetadata:
    kv_slots: torch.Tensor  # [bs, max seq_len] the batch's req_to_token rows, copied at launch
    seq_lens: torch.Tensor  # [bs]
    # Extend-shaped batches: each request's first row in q, cached tokens, new tokens.
    qo_start: torch.Tensor | None = None
    prefix_lens: torch.Tensor | None = None
    extend_lens: torch.Tensor | None = None
    max_extend_len: int = 0
    # Tree verification (module docstring); None: causal within the extension.
    custom_mask: torch.Tensor | None = None
    mask_start: torch.Tensor | None = None
    # Decode: splits per request, where each request's own keys start (zeros, or its group's prefix
    # length), and the shared-prefix groups (begin_forward; None: no pass).
    num_splits: int = 1
    num_prefix_splits: int = 1
    kv_start: torch.Tensor | None = None
    prefix: PrefixGroups | None = None


class TritonAttnBackend(AttentionBackend):
    def __init__(self, spec: AttentionBackendSpec):
        self.device = spec.device
        # The groups pass serves models without windows (a windowed layer reads a suffix of the
        # keys).
        self.shared_prefix = spec.shared_prefix and spec.sliding_window_size is None
        self.sms = triton_ops.sm_count(spec.device)
        self.supports_tree_mask = spec.sliding_window_size is None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        seq_lens = fb.seq_lens_cpu
        width = max(seq_lens, default=1)
        kv_slots = fb.req_to_token_pool.req_to_token[fb.req_pool_indices, :width]
        md = TritonMetadata(kv_slots=kv_slots, seq_lens=fb.seq_lens)
        if fb.forward_mode.is_decode():
            kv_heads = fb.token_to_kv_pool.num_kv_heads
            md.num_splits = triton_ops.decode_splits(fb.batch_size, kv_heads, self.sms)
            md.num_prefix_splits = triton_ops.decode_splits(1, kv_heads, self.sms)
            # Every request's keys from position 0, unless begin_forward finds groups (made here, at
            # launch: a tensor made while a CUDA graph is captured holds its value only in replays).
            md.kv_start = torch.zeros(fb.batch_size, dtype=torch.int64, device=self.device)
        else:
            ext = fb.extend_seq_lens_cpu
            as_t = lambda xs: to_device(xs, torch.int64, self.device)
            starts = [0]
            for n in ext[:-1]:
                starts.append(starts[-1] + n)
            md.qo_start, md.prefix_lens, md.extend_lens = (
                as_t(starts),
                as_t(fb.extend_prefix_lens_cpu),
                as_t(ext),
            )
            md.max_extend_len = max(ext, default=0)
            if fb.tree_mask is not None:
                md.custom_mask = fb.tree_mask.custom_mask.to(torch.uint8)
                md.mask_start = fb.tree_mask.mask_indptr[:-1]
        fb.attn_metadata = md

    def begin_forward(self, forward_batch: ForwardBatch) -> None:
        super().begin_forward(forward_batch)
        md: TritonMetadata = forward_batch.attn_metadata
        if (
            self.shared_prefix
            and forward_batch.forward_mode.is_decode()
            and forward_batch.batch_size > 1
        ):
            from radixlm.kernels.triton_ops.prefix_groups import find_prefix_groups

            md.prefix = find_prefix_groups(md.kv_slots, md.seq_lens)
            md.kv_start = md.prefix.kv_start

    def forward_extend(self, q, k, v, layer, forward_batch):
        from radixlm.kernels.triton_ops.extend_attention import extend_attention

        md: TritonMetadata = forward_batch.attn_metadata
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return extend_attention(
            q,
            k_buf,
            v_buf,
            torch.empty_like(q),
            md.kv_slots,
            md.qo_start,
            md.prefix_lens,
            md.extend_lens,
            md.max_extend_len,
            layer.scaling,
            layer.logit_cap,
            layer.sliding_window_size,
            md.custom_mask,
            md.mask_start,
            sinks=layer.sinks,
        )

    def forward_decode(self, q, k, v, layer, forward_batch):
        from radixlm.kernels.triton_ops.decode_attention import decode_attention

        md: TritonMetadata = forward_batch.attn_metadata
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return decode_attention(
            q,
            k_buf,
            v_buf,
            torch.empty_like(q),
            md.kv_slots,
            md.seq_lens,
            md.kv_start,
            md.num_splits,
            layer.scaling,
            layer.logit_cap,
            layer.sliding_window_size,
            md.prefix,
            md.num_prefix_splits,
            sinks=layer.sinks,
        )
