"""NoPrefixCache: --disable-radix-cache. Nothing is shared: every match is empty, a request's KV
stays its own until it finishes (scheduler/kv/cache_manager.py: NoCacheManager frees it then). A
baseline for benchmarks and the reference the radix cache's outputs must equal."""

from __future__ import annotations

import torch

from radixlm.cache.base_prefix_cache import (
    BasePrefixCache,
    CacheCapabilities,
    MatchResult,
    PrefixKey,
)
from radixlm.cache.tree_node import TreeNode, empty_indices


class NoPrefixCache(BasePrefixCache):
    def __init__(self) -> None:
        self.root_node = TreeNode()
        self.root_node.lock_ref = 1  # as a tree's root: never evicted, never counted

    def capabilities(self) -> CacheCapabilities:
        return CacheCapabilities(shares_prefixes=False)

    def match_prefix(self, key: PrefixKey) -> MatchResult:
        return MatchResult(empty_indices(), self.root_node)

    peek_prefix = match_prefix

    def insert(self, key: PrefixKey, value: torch.Tensor) -> int:
        raise TypeError("nothing is inserted without a prefix cache (--disable-radix-cache)")

    def inc_lock_ref(self, node: TreeNode) -> int:
        assert node is self.root_node, node
        return 0

    dec_lock_ref = inc_lock_ref

    def evict(self, num_tokens: int) -> int:
        return 0

    def flush(self, level: str = "l1") -> None:
        pass

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def path_to(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        return [], empty_indices()

    def all_nodes(self) -> list[TreeNode]:
        return []
