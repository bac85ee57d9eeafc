"""The prefix cache a server runs with: the radix tree, the tiered tree of the hierarchical cache
(each with state snapshots for a hybrid model), or none (--disable-radix-cache). Each kind is a
PREFIX_CACHE_REGISTRY entry (its module imported when chosen); `prefix_cache_kind` says which one
the options choose."""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.hicache_config import HiCacheConfig
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.state_pool import MambaPool
from radixlm.registry import Registry

# model_key(stored dtype): what stored KV depends on (the hierarchical cache's storage asks).
ModelKey = Callable[[torch.dtype], str]
# (the KV pool, --enable-hierarchical-cache's config, the model key, a hybrid model's state pool)
PrefixCacheFactory = Callable[
    [TokenToKVPool, HiCacheConfig | None, ModelKey, MambaPool | None], BasePrefixCache
]
PREFIX_CACHE_REGISTRY = Registry[PrefixCacheFactory, None]("prefix cache")
HYBRID_STORAGE_REFUSAL = (
    "--hicache-storage-backend: a hybrid model's state snapshots have no storage tier;"
    " use the host tier alone"
)


@PREFIX_CACHE_REGISTRY.register("radix")
def create_radix_cache(
    pool: TokenToKVPool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None,
) -> BasePrefixCache:
    from radixlm.cache.radix_cache import RadixCache

    return RadixCache(pool)


@PREFIX_CACHE_REGISTRY.register("hierarchical")
def create_hierarchical_cache(
    pool: TokenToKVPool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None,
) -> BasePrefixCache:
    from radixlm.cache.hiradix_cache import create_hiradix_cache

    assert hicache is not None, "the hierarchical cache needs its HiCacheConfig"
    return create_hiradix_cache(hicache, pool, model_key)


@PREFIX_CACHE_REGISTRY.register("mamba")
def create_mamba_radix_cache(
    pool: TokenToKVPool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None,
) -> BasePrefixCache:
    from radixlm.cache.mamba_radix_cache import MambaRadixCache

    assert state_pool is not None, "a hybrid model's cache needs its state pool"
    return MambaRadixCache(pool, state_pool)


@PREFIX_CACHE_REGISTRY.register("hierarchical-mamba")
def create_hierarchical_mamba_cache(
    pool: TokenToKVPool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None,
) -> BasePrefixCache:
    from radixlm.cache.hi_mamba_radix_cache import create_hi_mamba_radix_cache

    assert hicache is not None and state_pool is not None, "a hybrid's tiers need both"
    return create_hi_mamba_radix_cache(hicache, pool, state_pool)


@PREFIX_CACHE_REGISTRY.register("swa")
def create_swa_radix_cache(
    pool: TokenToKVPool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None,
) -> BasePrefixCache:
    from radixlm.cache.swa_radix_cache import SWARadixCache

    return SWARadixCache(pool, pool.window)


@PREFIX_CACHE_REGISTRY.register("none")
def create_no_prefix_cache(
    pool: TokenToKVPool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None,
) -> BasePrefixCache:
    from radixlm.cache.no_prefix_cache import NoPrefixCache

    return NoPrefixCache()


def prefix_cache_kind(
    disable_radix_cache: bool,
    hicache: HiCacheConfig | None,
    hybrid: bool = False,
    swa: bool = False,
) -> str:
    """--enable-hierarchical-cache (a HiCacheConfig), else --disable-radix-cache, else radix; for
    a hybrid model the kinds whose trees hold state snapshots, for a pool with windowed-layer slots
    (swa_pool.py; never with the hierarchical cache) the tree that tracks them. The one place a
    hybrid's storage tier is refused."""
    if hicache is not None:
        if not hybrid:
            return "hierarchical"
        if hicache.storage_backend is not None:
            raise ValueError(HYBRID_STORAGE_REFUSAL)
        return "hierarchical-mamba"
    if disable_radix_cache:
        return "none"
    return "mamba" if hybrid else "swa" if swa else "radix"


def create_prefix_cache(
    pool: TokenToKVPool,
    disable_radix_cache: bool,
    hicache: HiCacheConfig | None,
    model_key: ModelKey,
    state_pool: MambaPool | None = None,
) -> BasePrefixCache:
    """model_key(stored dtype): what stored KV depends on (the hierarchical cache's storage
    asks); state_pool: a hybrid model's (None: attention only)."""
    swa = pool.window > 0  # an SWATokenToKVPool
    kind = prefix_cache_kind(disable_radix_cache, hicache, state_pool is not None, swa)
    return PREFIX_CACHE_REGISTRY.get(kind)(pool, hicache, model_key, state_pool)
