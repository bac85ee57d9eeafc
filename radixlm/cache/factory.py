"""The prefix cache a server runs with: the radix tree, the tiered tree of the hierarchical cache,
or none (--disable-radix-cache)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.hicache_config import HiCacheConfig
from radixlm.cache.memory_pool import TokenToKVPool


def create_prefix_cache(
    pool: TokenToKVPool,
    disable_radix_cache: bool,
    hicache: HiCacheConfig | None,
    model_key: Callable[[torch.dtype], str],
) -> BasePrefixCache:
    """model_key(stored dtype): what stored KV depends on (the hierarchical cache's storage
    asks)."""
    if hicache is not None:
        from radixlm.cache.hiradix_cache import create_hiradix_cache

        return create_hiradix_cache(hicache, pool, model_key)
    if disable_radix_cache:
        from radixlm.cache.no_prefix_cache import NoPrefixCache

        return NoPrefixCache()
    from radixlm.cache.radix_cache import RadixCache

    return RadixCache(pool)
