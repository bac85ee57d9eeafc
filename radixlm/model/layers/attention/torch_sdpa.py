"""TorchSDPABackend: torch.nn.functional.scaled_dot_product_attention over K/V gathered from the
pool; runs on any device, with the model's dtype as the KV dtype.

Decode batches whose requests share a cached prefix attend to it once per group (shared_prefix.py);
other decode batches read the decode KV mirror when one is configured (decode_kv_mirror.py), else
gather their KV from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec
from radixlm.model.layers.attention.decode_kv_mirror import DecodeKVMirror, MirrorPlan
from radixlm.model.layers.attention.shared_prefix import (
    SharedPrefixMetadata,
    build_shared_prefix_metadata,
    gather_prefix_kv,
    shared_prefix_decode,
)

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


def supported(spec: AttentionBackendSpec) -> Optional[str]:
    """None where TorchSDPABackend runs spec, else why not: SDPA reads K/V in the queries' dtype."""
    if spec.kv_dtype != spec.dtype:
        return (f"kv_cache_dtype {str(spec.kv_dtype).replace('torch.', '')} differs from the model dtype and needs "
                "the native attention backend")
    return None


@dataclass
class _ExtendReq:
    start: int  # first row of this request in q
    length: int  # new tokens
    kv_indices: Optional[torch.Tensor]  # [prefix + new] pool slots; None: no prefix
    mask: Optional[torch.Tensor]  # [new, prefix + new] causal mask offset by the prefix


@dataclass
class SDPAMetadata:
    extend: list[_ExtendReq] = field(default_factory=list)
    max_len: int = 0
    decode_indices: Optional[torch.Tensor] = None  # [bs, max_len]
    decode_mask: Optional[torch.Tensor] = None  # [bs, 1, 1, max_len]
    shared: Optional[SharedPrefixMetadata] = None
    # The shared prefixes' gathered K/V per layer: filled by the first forward that needs them and
    # handed to later batches with the same prefixes (None: gather without keeping).
    prefix_kv: Optional[dict] = None
    mirror: Optional[MirrorPlan] = None  # decode reads the mirror when mirror.use


def gather_kv(buf: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """buf[indices] for a pool buffer [slots, heads, D]: index_select on a 2-D view is
    ~4x faster on CPU than advanced indexing (the gather dominates decode there). CPU pools are
    stored head-major (memory_pool.TokenToKVPool): gather each head's rows there."""
    if not buf.is_contiguous():
        rows = buf.transpose(0, 1).index_select(1, indices.reshape(-1))  # [heads, n, D]
        return rows.transpose(0, 1).reshape(*indices.shape, *buf.shape[1:])
    rows = buf.view(buf.shape[0], -1).index_select(0, indices.reshape(-1))
    return rows.view(*indices.shape, *buf.shape[1:])


class TorchSDPABackend(AttentionBackend):
    """SDPA per extend request, one padded SDPA per decode batch (see the module docstring)."""

    def __init__(self, shared_prefix: bool = True, mirror_bytes: int = 0):
        self.shared_prefix = shared_prefix
        self.mirror_bytes = mirror_bytes
        # The shared prefixes' gathered K/V, kept across decode steps while the groups' prefixes
        # stay the same and no KV slot was freed (their content is immutable till then). Shares the
        # mirror's memory budget; only one of the two holds memory at a time.
        self._kv_copy_bytes = mirror_bytes
        self.reset()

    def reset(self) -> None:
        self.mirror = DecodeKVMirror(self.mirror_bytes) if self.mirror_bytes > 0 else None
        self._prefix_kv: Optional[dict] = None
        self._prefix_key: Optional[tuple] = None

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        md = fb.attn_metadata = SDPAMetadata()
        req_to_token = fb.req_to_token_pool.req_to_token
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        if fb.batch_size == 0:
            return
        if fb.forward_mode.is_decode():
            self._init_decode(md, fb, fb.req_pool_indices, fb.seq_lens, seq_lens)
            return
        n_ext = fb.batch_size - fb.num_decode
        if fb.num_decode:  # MIXED: the decode tail goes through the batched decode path
            self._init_decode(md, fb, fb.req_pool_indices[n_ext:], fb.seq_lens[n_ext:], seq_lens[n_ext:])
        if n_ext == 0:
            return
        seq_lens = seq_lens[:n_ext]
        prefix_lens = (fb.extend_prefix_lens_cpu or [0] * fb.batch_size)[:n_ext]
        extend_lens = fb.extend_seq_lens_cpu[:n_ext] if fb.extend_seq_lens_cpu else [
            s - p for s, p in zip(seq_lens, prefix_lens)]
        device = fb.out_cache_loc.device
        rows = req_to_token[fb.req_pool_indices[:n_ext], : max(seq_lens)] if any(prefix_lens) else None
        start = 0
        for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
            if p == 0:
                md.extend.append(_ExtendReq(start, e, None, None))
            else:
                pos_k = torch.arange(p + e, device=device)
                pos_q = torch.arange(p, p + e, device=device)
                mask = pos_k[None, :] <= pos_q[:, None]
                md.extend.append(_ExtendReq(start, e, rows[i, : p + e], mask))
            start += e

    def _init_decode(self, md: SDPAMetadata, fb: "ForwardBatch", req_pool_indices, seq_lens_t, seq_lens: list[int]):
        # One padded gather for the whole batch (or the mirror's rows); padding masked out below.
        bs, max_len = len(seq_lens), max(seq_lens)
        md.max_len = max_len
        md.decode_indices = fb.req_to_token_pool.req_to_token[req_pool_indices, :max_len]
        pool = fb.token_to_kv_pool
        md.shared = (build_shared_prefix_metadata(md.decode_indices, seq_lens, pool.dtype)
                     if self.shared_prefix else None)
        if md.shared is not None:
            self._keep_prefix_kv(md, pool)
        elif self.mirror is not None:
            self._prefix_kv, self._prefix_key = None, None
            rows = req_pool_indices.tolist()
            gens = [fb.req_to_token_pool.generation[i] for i in rows]
            md.mirror = self.mirror.plan(rows, gens, seq_lens, md.decode_indices, pool)
            if md.mirror.use and md.mirror.batch_of_row is not None:  # the mask goes in row order
                seq_lens_t = seq_lens_t[md.mirror.batch_of_row]
        arange = torch.arange(max_len, device=seq_lens_t.device)
        md.decode_mask = (arange[None, :] < seq_lens_t[:, None]).view(bs, 1, 1, max_len)

    def _keep_prefix_kv(self, md: SDPAMetadata, pool) -> None:
        idx = md.shared.prefix_indices
        key = self._prefix_key
        if not (key is not None and key[1] == pool.free_epoch and key[0].shape == idx.shape and torch.equal(key[0], idx)):
            per_token = pool.bytes_per_token(pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype)
            keep = idx.numel() * per_token <= self._kv_copy_bytes
            self._prefix_key = (idx, pool.free_epoch) if keep else None
            self._prefix_kv = {} if keep else None  # a new store: batches planned earlier keep theirs
            if keep and self.mirror is not None:
                md.mirror = self.mirror.plan_release()
        md.prefix_kv = self._prefix_kv

    def begin_forward(self, forward_batch: "ForwardBatch") -> None:
        super().begin_forward(forward_batch)
        plan = forward_batch.attn_metadata.mirror
        if plan is not None:
            self.mirror.apply(plan, forward_batch.token_to_kv_pool)

    def forward_extend(self, q, k, v, layer, forward_batch):
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        out = torch.empty_like(q)
        if forward_batch.num_decode:  # MIXED: the last num_decode rows are decode queries
            t = q.shape[0] - forward_batch.num_decode
            out[t:] = self.forward_decode(q[t:], k[t:], v[t:], layer, forward_batch)
        for r in forward_batch.attn_metadata.extend:  # per request: prompts of different lengths
            s, e = r.start, r.start + r.length
            if r.kv_indices is None:  # no prefix: this request's K/V are the new ones
                ki, vi = k[s:e], v[s:e]
            else:
                ki, vi = gather_kv(k_buf, r.kv_indices), gather_kv(v_buf, r.kv_indices)
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1).unsqueeze(0),
                ki.transpose(0, 1).unsqueeze(0),
                vi.transpose(0, 1).unsqueeze(0),
                attn_mask=r.mask,
                is_causal=r.mask is None,
                scale=layer.scaling,
                enable_gqa=True,
            )
            out[s:e] = o[0].transpose(0, 1)
        return out

    def forward_decode(self, q, k, v, layer, forward_batch):
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        md = forward_batch.attn_metadata
        idx = md.decode_indices
        if idx is None:  # empty batch
            return torch.empty_like(q)
        if md.shared is not None:
            prefix_kv = md.prefix_kv.get(layer.layer_id) if md.prefix_kv is not None else None
            if prefix_kv is None:
                keep = md.prefix_kv is not None
                prefix_kv = gather_prefix_kv(k_buf, v_buf, md.shared, gather_kv, contiguous=keep)
                if keep:
                    md.prefix_kv[layer.layer_id] = prefix_kv
            return shared_prefix_decode(q, k_buf, v_buf, md.shared, layer.scaling, gather_kv, prefix_kv)
        plan = md.mirror
        if plan is not None and plan.use:  # rows 0..bs-1 of the dense copy hold the batch (in row order)
            kd, vd = self.mirror.write_and_view(layer.layer_id, k, v, md.max_len, plan)
            if plan.row_of is None:
                return _decode_sdpa(q, kd, vd, md.decode_mask, layer.scaling)
            return _decode_sdpa(q[plan.batch_of_row], kd, vd, md.decode_mask, layer.scaling)[plan.row_of]
        # [bs, max_len, kv_heads, D] -> [bs, kv_heads, max_len, D]
        return _decode_sdpa(q, gather_kv(k_buf, idx).transpose(1, 2), gather_kv(v_buf, idx).transpose(1, 2),
                            md.decode_mask, layer.scaling)


def _decode_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """One new token per request: q [bs, heads, D] over k/v [bs, kv_heads, L, D] -> [bs, heads, D].
    The query heads sharing a KV head go in as that head's query rows, so K/V are read once per KV
    head (SDPA's enable_gqa reads them once per query head: ~1.3x slower here; repeat_interleave
    of K/V ~15x). The mask [bs, 1, 1, L] is the same for every row."""
    bs, heads, d = q.shape
    kvh = k.shape[1]
    o = F.scaled_dot_product_attention(q.view(bs, kvh, heads // kvh, d), k, v, attn_mask=mask, scale=scale)
    return o.reshape(bs, heads, d)
