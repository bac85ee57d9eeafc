"""GatherDecodePath: every request's whole context gathered from the pool into one padded block
[bs, max_len], then one SDPA for the batch. Serves any decode batch: the last path tried."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.model.layers.attention.decode_path import (
    DecodeBatch,
    DecodePath,
    DecodePlan,
    decode_attention,
    gather_kv,
    padding_mask,
    window_mask,
)


@dataclass(kw_only=True)
class GatherDecodePlan(DecodePlan):
    kv_indices: torch.Tensor  # [bs, max_len] pool slots
    mask: torch.Tensor  # [bs, 1, 1, max_len]; the padding is masked out
    window_mask: torch.Tensor | None = None  # the windowed layers' mask (None: the model has none)


class GatherDecodePath(DecodePath):
    def __init__(self, sliding_window_size: int | None = None):
        self.sliding_window_size = sliding_window_size  # the model's windowed layers' window

    def plan(self, batch: DecodeBatch) -> GatherDecodePlan:
        window = self.sliding_window_size
        return GatherDecodePlan(
            path=self,
            kv_indices=batch.kv_indices,
            mask=padding_mask(batch.seq_lens, batch.max_len),
            window_mask=(
                None if window is None else window_mask(batch.seq_lens, batch.max_len, window)
            ),
        )

    def forward(self, q, k, v, layer, plan: GatherDecodePlan, kv_pool):
        k_buf, v_buf = kv_pool.get_kv_buffer(layer.layer_id)
        idx = plan.kv_indices
        mask = plan.mask if layer.sliding_window_size is None else plan.window_mask
        # [bs, max_len, kv_heads, D] -> [bs, kv_heads, max_len, D]
        return decode_attention(
            q,
            gather_kv(k_buf, idx).transpose(1, 2),
            gather_kv(v_buf, idx).transpose(1, 2),
            mask,
            layer,
        )
