"""MLAAttention: the attention op of one multi-head latent attention layer (DeepSeek-V2/V3).

The model hands it each new token's query [heads, qk_nope_head_dim + qk_rope_head_dim] and its
compressed KV: the normalized latent c_kv (kv_lora_rank) followed by the rotated RoPE key k_pe
(qk_rope_head_dim). It stores that one vector per token in the latent pool
(cache/mla_pool.py) and hands the attention to the batch's backend (an MLA backend,
attention/mla_backend.py), which reads the latents of each request and uses kv_b_proj:
- decompressed (prefill): k_nope | v = c_kv @ W_kv_b^T per head, k = k_nope | k_pe, ordinary
attention;
- absorbed (decode): q_lat = q_nope @ W_UK (per head), scores = [q_lat | q_pe] . [c_kv | k_pe],
  o_lat = softmax . c_kv, o = o_lat @ W_UV^T: the latent is read once for all heads.

It is a RadixAttention (one "KV head" of kv_lora_rank + qk_rope_head_dim dims) so what walks a
model's attention layers (the runner's KV sizing, attention_features) sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from radixlm.model.layers.attention.radix_attention import RadixAttention

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class MLAAttention(RadixAttention):
    index_head_dim = 0  # the NSA indexer's key kept beside the latent (nsa_attention.py)

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
    ):
        """kv_b_weight(): kv_b_proj's float weight [heads * (qk_nope_head_dim + v_head_dim),
        kv_lora_rank] (a callable, so weight updates and a dequantized GGUF tensor are read as they
        are now)."""
        super().__init__(num_heads, kv_lora_rank + qk_rope_head_dim, scaling, 1, layer_id)
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = v_head_dim, kv_lora_rank
        self.kv_b_weight = kv_b_weight

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def kv_b_per_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, qk_nope_head_dim, kv_lora_rank], W_UV [heads, v_head_dim, kv_lora_rank]),
        views."""
        w = self.kv_b_weight().view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def forward(
        self, q: torch.Tensor, latent: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:  # type: ignore[override]
        """q: [T, heads, qk_head_dim], latent: [T, kv_lora_rank + qk_rope_head_dim] -> [T, heads *
        v_head_dim]."""
        latent = latent.view(-1, 1, self.head_dim)
        forward_batch.token_to_kv_pool.set_kv_buffer(
            self.layer_id, forward_batch.out_cache_loc, latent, None
        )
        backend = forward_batch.attn_backend
        if forward_batch.forward_mode.is_decode():
            o = backend.forward_decode(q, latent, None, self, forward_batch)
        else:
            o = backend.forward_extend(q, latent, None, self, forward_batch)
        return o.reshape(-1, self.num_heads * self.v_head_dim)
