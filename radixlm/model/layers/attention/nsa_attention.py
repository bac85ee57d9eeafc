"""NSAAttention: DeepSeek-V3.2's sparse multi-head latent attention (SGLang's NSA backend role).

An MLAAttention whose pool rows also keep each token's indexer key (cache/mla_pool.py: [c_kv |
k_pe | index_k]), so a radix-cache hit or an earlier prefill chunk hands the indexer its keys as it
hands MLA its latents. Each query's indexer scores every cached token of its request
(nsa_indexer.select_topk) and the MLA backend attends only the kept ones (mla_backend.SparseKeep).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from radixlm.model.layers.attention.mla_attention import MLAAttention
from radixlm.model.layers.attention.mla_backend import MLABackend, MLAMetadata, SparseKeep
from radixlm.model.layers.attention.nsa_indexer import IndexerOutput, select_topk

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class NSAAttention(MLAAttention):
    def __init__(
        self,
        num_heads: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        scaling: float,
        layer_id: int,
        kv_b_weight: Callable[[], torch.Tensor],
        index_head_dim: int,
        index_topk: int,
    ):
        super().__init__(
            num_heads,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            kv_lora_rank,
            scaling,
            layer_id,
            kv_b_weight,
        )
        self.index_head_dim, self.index_topk = index_head_dim, index_topk

    def forward(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        forward_batch: ForwardBatch,
        index: IndexerOutput,
    ) -> torch.Tensor:  # type: ignore[override]
        """q [T, heads, qk_head_dim], latent [T, kv_lora_rank + rope], index: this layer's
        indexer output for the same tokens -> [T, heads * v_head_dim]."""
        fb = forward_batch
        row = torch.cat((latent, index.k.to(latent.dtype)), dim=-1)
        fb.token_to_kv_pool.set_kv_buffer(self.layer_id, fb.out_cache_loc, row[:, None], None)
        backend = fb.attn_backend
        if not isinstance(backend, MLABackend):
            raise ValueError(
                f"DeepSeek sparse attention runs on the mla attention backend, not {backend!r}"
            )
        keep = self._keep(index, fb)
        latent = latent.view(-1, 1, self.head_dim)
        if fb.forward_mode.is_decode():
            o = backend.forward_decode(q, latent, None, self, fb, keep)
        else:
            o = backend.forward_extend(q, latent, None, self, fb, keep)
        return o.reshape(-1, self.num_heads * self.v_head_dim)

    def _keep(self, index: IndexerOutput, fb: ForwardBatch) -> SparseKeep:
        md: MLAMetadata = fb.attn_metadata
        keys = fb.token_to_kv_pool.get_index_k_buffer(self.layer_id)
        keep = SparseKeep([])
        for r in md.extend:
            s, e = r.start, r.start + r.length
            visible = r.tree_mask
            if visible is None:
                pos_k = torch.arange(r.prefix + r.length, device=keys.device)
                pos_q = torch.arange(r.prefix, r.prefix + r.length, device=keys.device)
                visible = pos_k[None, :] <= pos_q[:, None]
            keep.extend.append(
                select_topk(
                    index.q[s:e],
                    index.weights[s:e],
                    keys[r.kv_indices],
                    visible,
                    self.index_topk,
                )
            )
        if md.decode_indices is not None:  # the decode rows: the batch's last ones
            n = md.decode_indices.shape[0]
            t = index.q.shape[0] - n
            pos = torch.arange(md.decode_indices.shape[1], device=keys.device)
            visible = pos[None, :] < md.decode_lens[:, None]
            keep.decode = select_topk(
                index.q[t:], index.weights[t:], keys[md.decode_indices], visible, self.index_topk
            )
        return keep
