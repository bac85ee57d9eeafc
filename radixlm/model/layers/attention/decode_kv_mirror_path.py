"""DecodeKVMirrorPath: decode attention over the dense copy of the decoding requests' KV
(decode_kv_mirror.py), for batches whose copy fits its byte budget; larger ones go to the next
path. The copy's memory is the budget it shares with the kept shared-prefix K/V."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.model.layers.attention.decode_kv_mirror import DecodeKVMirror, MirrorPlan
from radixlm.model.layers.attention.decode_path import (
    DecodeBatch,
    DecodePath,
    DecodePlan,
    decode_sdpa,
    padding_mask,
)


@dataclass(kw_only=True)
class MirrorDecodePlan(DecodePlan):
    mirror: MirrorPlan  # rows, fills and moves (begin_forward performs them)
    max_len: int
    mask: torch.Tensor  # [bs, 1, 1, max_len] in the mirror's row order
    claims_kv_budget: bool = True  # the rows are KV kept across steps


@dataclass(kw_only=True)
class MirrorReleasePlan(DecodePlan):
    """Drops the mirror's buffers on the forward's thread (another path serves the batch)."""

    mirror: MirrorPlan


class DecodeKVMirrorPath(DecodePath):
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.reset()

    def reset(self) -> None:
        self.mirror = DecodeKVMirror(self.max_bytes)

    def release(self) -> MirrorReleasePlan:
        return MirrorReleasePlan(path=self, mirror=self.mirror.plan_release())

    def plan(self, batch: DecodeBatch) -> MirrorDecodePlan | None:
        rows = batch.req_pool_indices.tolist()
        generations = [batch.req_to_token_pool.generation[i] for i in rows]
        plan = self.mirror.plan(
            rows, generations, batch.seq_lens_cpu, batch.kv_indices, batch.token_to_kv_pool
        )
        if plan is None:  # over the budget
            return None
        seq_lens = (
            batch.seq_lens if plan.batch_of_row is None else batch.seq_lens[plan.batch_of_row]
        )
        return MirrorDecodePlan(
            path=self,
            mirror=plan,
            max_len=batch.max_len,
            mask=padding_mask(seq_lens, batch.max_len),
        )

    def begin_forward(self, plan: MirrorDecodePlan | MirrorReleasePlan, kv_pool) -> None:
        self.mirror.apply(plan.mirror, kv_pool)

    def forward(self, q, k, v, layer, plan: MirrorDecodePlan, kv_pool):
        # Rows 0..bs-1 of the dense copy hold the batch, in row order.
        mp = plan.mirror
        kd, vd = self.mirror.write_and_view(layer.layer_id, k, v, plan.max_len, mp)
        if mp.row_of is None:
            return decode_sdpa(q, kd, vd, plan.mask, layer.scaling)
        return decode_sdpa(q[mp.batch_of_row], kd, vd, plan.mask, layer.scaling)[mp.row_of]
