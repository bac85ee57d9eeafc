"""GatherDecodePath: every request's whole context gathered from the pool into one padded block
[bs, max_len], then one SDPA for the batch. Serves any decode batch: the last path tried."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.model.layers.attention.decode_path import (
    DecodeBatch,
    DecodePath,
    DecodePlan,
    decode_sdpa,
    gather_kv,
    padding_mask,
)


@dataclass(kw_only=True)
class GatherDecodePlan(DecodePlan):
    kv_indices: torch.Tensor  # [bs, max_len] pool slots
    mask: torch.Tensor  # [bs, 1, 1, max_len]; the padding is masked out


class GatherDecodePath(DecodePath):
    def plan(self, batch: DecodeBatch) -> GatherDecodePlan:
        return GatherDecodePlan(path=self, kv_indices=batch.kv_indices,
                                mask=padding_mask(batch.seq_lens, batch.max_len))

    def forward(self, q, k, v, layer, plan: GatherDecodePlan, kv_pool):
        k_buf, v_buf = kv_pool.get_kv_buffer(layer.layer_id)
        idx = plan.kv_indices
        # [bs, max_len, kv_heads, D] -> [bs, kv_heads, max_len, D]
        return decode_sdpa(q, gather_kv(k_buf, idx).transpose(1, 2), gather_kv(v_buf, idx).transpose(1, 2),
                           plan.mask, layer.scaling)
