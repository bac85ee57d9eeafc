"""HiRadixCache: the radix tree over three tiers of KV (SGLang's HiCache, on a CPU engine): the tree
(radix_cache.py) composed with the HostTier tier policy (host_tier.py: L1 the device pool, L2 host
memory, L3 an optional storage tier), and no state snapshots. What the tiers do and when KV moves
between them is host_tier.py's; this module names the combination and sizes it from the options
(create_hiradix_cache). See docs/architecture.md, "Hierarchical cache".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.hicache_io import HiCacheStats, Prefetch
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.host_tier import HostTier
from radixlm.cache.kv_data import KVData
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.payloads import HostSlots
from radixlm.cache.radix_cache import RadixCache
from radixlm.cache.storage_tier import BaseStorageTier, NoStorageTier

if TYPE_CHECKING:
    from radixlm.cache.hicache_config import HiCacheConfig
    from radixlm.cache.tree_parts import SnapshotPart

logger = logging.getLogger(__name__)


class HiRadixCache(RadixCache):
    """The tree with a HostTier (snapshots: HiMambaRadixCache's host-backed ones, else none). The
    tier's state and calls are named here for the callers that hold the cache."""

    PARTS = (HostSlots,)

    def __init__(
        self,
        token_to_kv_pool: TokenToKVPool,
        host_pool: HostKVPool,
        write_policy: str = "write_through",
        storage_tier: BaseStorageTier | None = None,
        stats: HiCacheStats | None = None,
        snapshots: SnapshotPart | None = None,
    ):
        self.host_tier = HostTier(host_pool, write_policy, storage_tier, stats)
        super().__init__(token_to_kv_pool, self.host_tier, snapshots)

    @property
    def host_pool(self) -> HostKVPool:
        return self.host_tier.host_pool

    @property
    def write_policy(self) -> str:
        return self.host_tier.write_policy

    @property
    def stats(self) -> HiCacheStats:
        return self.host_tier.stats

    @property
    def storage_tier(self) -> BaseStorageTier:
        return self.host_tier.storage_tier

    @property
    def prefetches(self) -> list[Prefetch]:
        return self.host_tier.prefetches

    def match_len(self, key: PrefixKey) -> int:
        return self.host_tier.match_len(key)

    def insert_host(self, key: PrefixKey, start: int, chunks: list[KVData]) -> int:
        return self.host_tier.insert_host(key, start, chunks)

    def evict_host(self, num_tokens: int) -> int:
        return self.host_tier.evict_host(num_tokens)

    def host_size(self) -> int:
        return self.host_tier.host_size()


def host_kv_size(
    config: HiCacheConfig, pool: TokenToKVPool, dtype: torch.dtype, share: float = 1.0
) -> tuple[int, int]:
    """(L2's tokens, its bytes per token): `share` of --hicache-size's bytes (the rest holds a
    hybrid model's state snapshots), else --hicache-ratio x L1's tokens."""
    v_dim = None if pool.v_head_dim else 0  # K's width, or no V (an MLA latent pool)
    per_token = sum(  # the layers L1 holds, each of its own shape (HostKVPool mirrors them)
        TokenToKVPool.bytes_per_token(1, *pool.layer_shape(i), dtype, v_dim) for i in pool.layers
    )
    return host_slots(config, per_token, pool.size, share, "token"), per_token


def host_slots(config: HiCacheConfig, per_slot: int, device_slots: int, share: float, what: str):
    """How many slots of per_slot bytes the host tier holds: `share` of --hicache-size's bytes,
    else --hicache-ratio x the device's slots."""
    n = (
        int(config.size_gb * 2**30 * share) // per_slot
        if config.size_gb > 0
        else int(config.ratio * device_slots)
    )
    if n < 1:
        raise ValueError(
            f"the host tier would hold no {what} (raise --hicache-size or --hicache-ratio)"
        )
    return n


def create_hiradix_cache(
    config: HiCacheConfig, pool: TokenToKVPool, model_key: Callable[[torch.dtype], str]
) -> HiRadixCache:
    """The tiered cache over `pool`. model_key(stored dtype): what stored KV depends on (asked only
    when there is a storage tier: it reads the weights and the tokenizer)."""
    from radixlm.cache.host_pool import host_dtype_for
    from radixlm.cache.storage import create_storage
    from radixlm.cache.storage_codec import ChunkLayout
    from radixlm.cache.storage_tier import StorageTier

    dtype = host_dtype_for(pool.dtype, config.dtype)
    size, per_token = host_kv_size(config, pool, dtype)
    stats, storage = HiCacheStats(), NoStorageTier()
    if config.storage_backend is not None:
        if pool.layer_shapes is not None:
            raise ValueError(
                "hicache_storage_backend: this model keeps KV of a shape per layer, which the"
                " storage tier's chunks cannot hold yet (the host tier can: drop the backend)"
            )
        key = model_key(dtype)
        layout = ChunkLayout(
            pool.num_layers,
            pool.num_kv_heads,
            pool.head_dim,
            dtype,
            config.storage_chunk_size,
            pool.v_head_dim,
        )
        backend = create_storage(
            config.storage_backend,
            config.storage_dir,
            key,
            layout,
            int(config.storage_size_gb * 2**30),
            stats,
            config.storage_key,
            config.storage_extra_config,
        )
        storage = StorageTier(backend, key, config.storage_chunk_size, stats)
    logger.info(
        "hierarchical cache: L2 %d tokens (%.1f MiB, %s), write policy %s%s",
        size,
        size * per_token / 2**20,
        str(dtype).replace("torch.", ""),
        config.write_policy,
        f", L3 {config.storage_backend} in {config.storage_dir}" if config.storage_backend else "",
    )
    return HiRadixCache(pool, HostKVPool(size, pool, dtype), config.write_policy, storage, stats)
