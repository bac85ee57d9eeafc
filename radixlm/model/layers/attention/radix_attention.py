"""RadixAttention: the attention op of one layer, the one models call.

It stores the new tokens' K/V in the pool and hands the attention to the batch's backend
(forward_batch.attn_backend, set by whoever builds the ForwardBatch: ModelRunner.prepare).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling, self.layer_id = scaling, layer_id

    def forward(self, q, k, v, forward_batch: "ForwardBatch") -> torch.Tensor:
        """q: [T, heads * D], k/v: [T, kv_heads * D] -> [T, heads * D]."""
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        forward_batch.token_to_kv_pool.set_kv_buffer(self.layer_id, forward_batch.out_cache_loc, k, v)
        backend = forward_batch.attn_backend
        if forward_batch.forward_mode.is_decode():
            o = backend.forward_decode(q, k, v, self, forward_batch)
        else:
            o = backend.forward_extend(q, k, v, self, forward_batch)
        return o.reshape(-1, self.num_heads * self.head_dim)
