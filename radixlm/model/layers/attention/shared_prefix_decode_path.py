"""SharedPrefixDecodePath: decode batches whose requests share a cached prefix attend to it once per
group (the attention itself: shared_prefix.py).

It also keeps the groups' gathered prefix K/V across steps, while the groups' prefixes stay the
same and no KV slot was freed (till then the slots' content is immutable), so a run of decode
steps over the same system prompt gathers it once. The copy takes the budget it shares with the
decode KV mirror.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.model.layers.attention.decode_path import (
    DecodeBatch,
    DecodePath,
    DecodePlan,
    gather_kv,
)
from radixlm.model.layers.attention.shared_prefix import (
    SharedPrefixMetadata,
    build_shared_prefix_metadata,
    gather_prefix_kv,
    shared_prefix_decode,
)


@dataclass(kw_only=True)
class SharedPrefixDecodePlan(DecodePlan):
    shared: SharedPrefixMetadata
    # The prefixes' gathered K/V per layer: filled by the first forward that needs them and handed
    # to later batches with the same prefixes (None: gather without keeping).
    prefix_kv: dict | None


class SharedPrefixDecodePath(DecodePath):
    def __init__(self, max_kept_bytes: int):
        self.max_kept_bytes = max_kept_bytes
        self.reset()

    def reset(self) -> None:
        self._prefix_kv: dict | None = None
        self._prefix_key: tuple | None = None  # (prefix slots, the pool's free_epoch) of _prefix_kv

    def release(self) -> None:
        # Nothing to do on the forward's thread: batches planned earlier hold their own reference.
        self.reset()

    def plan(self, batch: DecodeBatch) -> SharedPrefixDecodePlan | None:
        pool = batch.token_to_kv_pool
        shared = build_shared_prefix_metadata(batch.kv_indices, batch.seq_lens_cpu, pool.dtype)
        if shared is None:  # no group shares a prefix worth a second pass
            return None
        idx, key = shared.prefix_indices, self._prefix_key
        claims = False
        if not (
            key is not None
            and key[1] == pool.free_epoch
            and key[0].shape == idx.shape
            and torch.equal(key[0], idx)
        ):
            per_token = pool.bytes_per_token(
                pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype
            )
            keep = idx.numel() * per_token <= self.max_kept_bytes
            self._prefix_key = (idx, pool.free_epoch) if keep else None
            self._prefix_kv = (
                {} if keep else None
            )  # a new store: batches planned earlier keep theirs
            claims = keep
        return SharedPrefixDecodePlan(
            path=self, shared=shared, prefix_kv=self._prefix_kv, claims_kv_budget=claims
        )

    def forward(self, q, k, v, layer, plan: SharedPrefixDecodePlan, kv_pool):
        k_buf, v_buf = kv_pool.get_kv_buffer(layer.layer_id)
        kept = plan.prefix_kv
        prefix_kv = kept.get(layer.layer_id) if kept is not None else None
        if prefix_kv is None:
            # Kept copies head-major (contiguous): read by every later step, they repay the copy.
            prefix_kv = gather_prefix_kv(
                k_buf, v_buf, plan.shared, gather_kv, contiguous=kept is not None
            )
            if kept is not None:
                kept[layer.layer_id] = prefix_kv
        return shared_prefix_decode(
            q, k_buf, v_buf, plan.shared, layer.scaling, gather_kv, prefix_kv
        )
