"""The MLA attention backend: attention over the latent KV pool of DeepSeek-V2/V3 (SGLang's
FlashMLA / Triton MLA backends' roles, on CPU).

- Extend (prefill, chunked prefill over a cached prefix, MIXED, TARGET_VERIFY): per request, the
  latents of its whole sequence are read from the pool and decompressed with kv_b_proj into
  per-head K (k_nope | shared k_pe) and V, then ordinary causal attention (SDPA). The cost of the
  decompression is paid once per prefill token, as SGLang's prefill does.
- Decode: weight absorption. q_nope is multiplied into the latent space once per step
  (q_lat = q_nope @ W_UK), each head then attends the stored vectors [c_kv | k_pe] directly, and
  the latent output goes back through W_UV: no per-head K/V is ever built and each request's
  latents are read once for all heads (the native `mla_decode` op where it loads; a batched torch
  gather otherwise). `absorb=False` decodes by decompression instead (the benchmark's baseline).
- Sparse (DeepSeek-V3.2's NSA, attention/nsa_attention.py): the same paths, each query restricted
  to the cached tokens its indexer kept (`keep`, over the rows init_forward_metadata built), the
  decode in torch (the native op attends every token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch
    from radixlm.model.layers.attention.mla_attention import MLAAttention


def supported(spec: AttentionBackendSpec) -> str | None:
    if not spec.mla:
        return "runs multi-head latent attention models (DeepSeek-V2/V3) only"
    if spec.sliding_window_size is not None or spec.logit_cap or spec.sinks:
        return "no sliding window, logit soft-capping or attention sinks"
    if spec.attention_chunk_size is not None:
        return "no chunked attention"
    return None


@dataclass
class _ExtendReq:
    start: int  # first row of the request's new tokens in the batch
    length: int  # its new tokens
    prefix: int  # its tokens already in the pool
    kv_indices: torch.Tensor  # [prefix + length] slots of its whole sequence
    tree_mask: torch.Tensor | None = (
        None  # a draft tree's [length, prefix + length] mask; None: causal
    )


@dataclass
class MLAMetadata:
    extend: list[_ExtendReq] = field(default_factory=list)
    # The decode rows (a DECODE batch, or a MIXED batch's tail): slots [rows, max_len] (padded with
    # slot 0, the dummy) and lengths.
    decode_indices: torch.Tensor | None = None
    decode_lens: torch.Tensor | None = None
    decode_lens_cpu: list[int] = field(default_factory=list)


@dataclass
class SparseKeep:
    """Which cached tokens each query may attend (True: kept), over MLAMetadata's rows: per extend
    request [length, prefix + length], and the decode rows' [rows, max_len]."""

    extend: list[torch.Tensor]
    decode: torch.Tensor | None = None


def decompress(layer: MLAAttention, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """latent [S, kv_lora_rank + rope] -> (k [S, heads, qk_head_dim], v [S, heads, v_head_dim])."""
    r, heads = layer.kv_lora_rank, layer.num_heads
    w = layer.kv_b_weight()
    kv = F.linear(latent[:, :r].to(w.dtype), w).view(
        -1, heads, layer.qk_nope_head_dim + layer.v_head_dim
    )
    k_nope, v = kv.split([layer.qk_nope_head_dim, layer.v_head_dim], dim=-1)
    k_pe = latent[:, None, r:].to(w.dtype).expand(-1, heads, -1)
    return torch.cat((k_nope, k_pe), dim=-1), v


def absorbed_decode_torch(
    q_lat: torch.Tensor,
    latent_buf: torch.Tensor,
    kv_indices: torch.Tensor,
    lens: torch.Tensor,
    kv_lora_rank: int,
    scaling: float,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """q_lat [B, heads, D] (D = kv_lora_rank + rope) over each row's latents -> o_lat [B, heads,
    kv_lora_rank]; keep [B, L]: only those tokens (NSA)."""
    lat = latent_buf[kv_indices].to(q_lat.dtype)  # [B, L, D]: once per request, for every head
    scores = torch.einsum("bhd,bld->bhl", q_lat, lat).float() * scaling
    valid = torch.arange(kv_indices.shape[1], device=lens.device)[None, :] < lens[:, None]
    if keep is not None:
        valid = valid & keep
    p = scores.masked_fill(~valid[:, None, :], float("-inf")).softmax(dim=-1).to(q_lat.dtype)
    return torch.einsum("bhl,blr->bhr", p, lat[..., :kv_lora_rank])


class MLABackend(AttentionBackend):
    def __init__(self, absorb: bool = True, native: bool = True):
        self.absorb, self.native = absorb, native

    def __repr__(self) -> str:
        return f"MLABackend(absorb={self.absorb})"

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        md = fb.attn_metadata = MLAMetadata()
        if fb.batch_size == 0:
            return
        req_to_token = fb.req_to_token_pool.req_to_token
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        n_dec = fb.batch_size if fb.forward_mode.is_decode() else fb.num_decode
        n_ext = fb.batch_size - n_dec
        if n_dec:  # copies of the rows as they are at launch (the scheduler may change them next)
            lens = seq_lens[n_ext:]
            md.decode_indices = req_to_token[fb.req_pool_indices[n_ext:], : max(lens)]
            pos = torch.arange(max(lens), device=md.decode_indices.device)
            lens_t = torch.tensor(lens, dtype=torch.int64, device=md.decode_indices.device)
            md.decode_indices = md.decode_indices.masked_fill(pos[None, :] >= lens_t[:, None], 0)
            md.decode_lens, md.decode_lens_cpu = lens_t, lens
        if n_ext == 0:
            return
        prefix_lens = (fb.extend_prefix_lens_cpu or [0] * fb.batch_size)[:n_ext]
        extend_lens = (
            fb.extend_seq_lens_cpu[:n_ext]
            if fb.extend_seq_lens_cpu
            else [s - p for s, p in zip(seq_lens[:n_ext], prefix_lens)]
        )
        rows = req_to_token[fb.req_pool_indices[:n_ext], : max(seq_lens[:n_ext])]
        start, tree = 0, fb.tree_mask
        for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
            req = _ExtendReq(start, e, p, rows[i, : p + e])
            if tree is not None and not tree.is_causal(i):
                req.tree_mask = tree.extend_masks(i, p, None, rows.device)[0]
            md.extend.append(req)
            start += e

    def forward_extend(
        self,
        q,
        k,
        v,
        layer: MLAAttention,
        forward_batch: ForwardBatch,
        keep: SparseKeep | None = None,
    ) -> torch.Tensor:
        md = forward_batch.attn_metadata
        latent_buf = forward_batch.token_to_kv_pool.get_latent_buffer(layer.layer_id)
        out = q.new_empty(q.shape[0], layer.num_heads, layer.v_head_dim)
        if forward_batch.num_decode:  # MIXED: the last num_decode rows are decode queries
            t = q.shape[0] - forward_batch.num_decode
            out[t:] = self._decode_rows(q[t:], layer, md, latent_buf, keep)
        for i, r in enumerate(md.extend):
            s, e = r.start, r.start + r.length
            latent = k[s:e, 0] if r.prefix == 0 else latent_buf[r.kv_indices]
            ki, vi = decompress(layer, latent)
            mask = r.tree_mask
            if mask is None and (r.prefix or keep is not None):
                pos_k = torch.arange(r.prefix + r.length, device=q.device)
                mask = (
                    pos_k[None, :]
                    <= torch.arange(r.prefix, r.prefix + r.length, device=q.device)[:, None]
                )
            if keep is not None:
                mask = mask & keep.extend[i]
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1),
                ki.transpose(0, 1),
                vi.transpose(0, 1),
                attn_mask=mask,
                is_causal=mask is None,
                scale=layer.scaling,
            )
            out[s:e] = o.transpose(0, 1)
        return out

    def forward_decode(
        self,
        q,
        k,
        v,
        layer: MLAAttention,
        forward_batch: ForwardBatch,
        keep: SparseKeep | None = None,
    ) -> torch.Tensor:
        md = forward_batch.attn_metadata
        if md.decode_indices is None:  # empty batch
            return q.new_empty(0, layer.num_heads, layer.v_head_dim)
        return self._decode_rows(
            q, layer, md, forward_batch.token_to_kv_pool.get_latent_buffer(layer.layer_id), keep
        )

    def _decode_rows(
        self,
        q: torch.Tensor,
        layer: MLAAttention,
        md: MLAMetadata,
        latent_buf: torch.Tensor,
        keep: SparseKeep | None = None,
    ) -> torch.Tensor:
        """q [B, heads, qk_head_dim] of one-token rows -> [B, heads, v_head_dim]."""
        rows = None if keep is None else keep.decode
        if not self.absorb:
            return self._decompressed_decode(q, layer, md, latent_buf, rows)
        w_uk, w_uv = layer.kv_b_per_head()
        q_nope, q_pe = q.split([layer.qk_nope_head_dim, layer.qk_rope_head_dim], dim=-1)
        q_lat = torch.cat((torch.einsum("bhn,hnr->bhr", q_nope, w_uk.to(q.dtype)), q_pe), dim=-1)
        o_lat = self._attend_latent(q_lat.contiguous(), latent_buf, md, layer, rows)
        return torch.einsum("bhr,hvr->bhv", o_lat, w_uv.to(q.dtype))

    def _attend_latent(
        self, q_lat, latent_buf, md: MLAMetadata, layer: MLAAttention, keep=None
    ) -> torch.Tensor:
        if self.native and keep is None:  # the op attends every token
            from radixlm.model.layers.attention.mla_native import mla_decode_native

            o = mla_decode_native(
                q_lat,
                latent_buf,
                md.decode_indices,
                md.decode_lens,
                layer.kv_lora_rank,
                layer.scaling,
            )
            if o is not None:
                return o
        return absorbed_decode_torch(
            q_lat,
            latent_buf,
            md.decode_indices,
            md.decode_lens,
            layer.kv_lora_rank,
            layer.scaling,
            keep,
        )

    @staticmethod
    def _decompressed_decode(
        q, layer: MLAAttention, md: MLAMetadata, latent_buf, keep=None
    ) -> torch.Tensor:
        out = q.new_empty(q.shape[0], layer.num_heads, layer.v_head_dim)
        for i, n in enumerate(md.decode_lens_cpu):
            ki, vi = decompress(layer, latent_buf[md.decode_indices[i, :n]])
            o = F.scaled_dot_product_attention(
                q[i : i + 1].transpose(0, 1),
                ki.transpose(0, 1),
                vi.transpose(0, 1),
                attn_mask=None if keep is None else keep[i, :n],
                scale=layer.scaling,
            )
            out[i] = o[:, 0]
        return out
