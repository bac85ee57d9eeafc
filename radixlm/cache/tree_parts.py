"""The two behaviours a radix tree (radix_cache.py: RadixCache) is composed with (issue 89): its
tier policy (CacheTier: where KV that leaves the device goes) and its state snapshots
(SnapshotPart: a hybrid model's states at nodes, which decide where a match may end). The tree
calls their hooks; each comes as a no-op and real versions side by side:

    CacheTier      DeviceOnlyTier (radix_cache.py: evicted KV is gone)
                   HostTier (hiradix_cache.py: L2 in host memory, L3 storage)
    SnapshotPart   NoSnapshots (radix_cache.py: a match ends where the KV does)
                   DeviceSnapshots (mamba_radix_cache.py), HostSnapshots (hi_mamba_radix_cache.py:
                   backed up on the host, over a HostTier)

A part that keeps something per node names its payload class (PAYLOAD, payloads.py); the tree's
PARTS list them. The parts reach the tree they were bound to (bind) for its nodes, sizes, locks
and eviction. See docs/architecture.md, "KV ownership".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from radixlm.cache.base_prefix_cache import BasePrefixCache, MatchResult, PrefixKey
    from radixlm.cache.hicache_io import Prefetch
    from radixlm.cache.payloads import CachePart
    from radixlm.cache.tree_node import TreeNode


class CacheTier(ABC):
    """Where a tree's KV lives beside the device pool (L1), and what moves it between tiers."""

    PAYLOAD: ClassVar[type[CachePart] | None] = None

    @abstractmethod
    def bind(self, tree: BasePrefixCache) -> None:
        """Become the tier of `tree` (once, before its first reset)."""

    @abstractmethod
    def reset(self) -> None:
        """The tree was dropped: drop what this tier holds for it."""

    @abstractmethod
    def extend_match(self, key: PrefixKey, l1: MatchResult) -> MatchResult:
        """Admission: l1 is key's match in L1 (ending exactly at it); bring what continues it from
        lower tiers into L1 and return the whole match."""

    @abstractmethod
    def on_inserted(self, new_nodes: list[TreeNode], last: TreeNode) -> None:
        """new_nodes (in path order, ending at last) just took KV slots."""

    @abstractmethod
    def evict_node(self, node: TreeNode) -> None:
        """An evictable node's KV leaves L1: free its slots; it leaves the tree or stays in a lower
        tier (the snapshot part's leave_l1 ran first)."""

    @abstractmethod
    def flush(self, level: str) -> None:
        """The tree's flush (FLUSH_LEVELS)."""

    @abstractmethod
    def check(self) -> str | None:
        """What is wrong with the tiers' invariants, or None."""

    @abstractmethod
    def info(self) -> dict: ...

    @abstractmethod
    def start_prefetch(self, key: PrefixKey) -> Prefetch | None: ...

    @abstractmethod
    def has_prefetches(self) -> bool: ...

    @abstractmethod
    def poll_prefetches(self) -> None: ...

    @abstractmethod
    def wait_writes(self, timeout: float | None) -> bool: ...

    @abstractmethod
    def close(self) -> None: ...


class SnapshotPart(ABC):
    """A hybrid model's state snapshots at nodes: where a match may end (only where the states
    after it were kept), which leaves go first, what a node's snapshot does when the node leaves
    L1 or the tree; and the state tracker's calls (BasePrefixCache.snapshot_slot, attach_state,
    alloc_state, ...), which the tree passes on."""

    PAYLOAD: ClassVar[type[CachePart] | None] = None

    @abstractmethod
    def bind(self, tree: BasePrefixCache) -> None:
        """Become the snapshots of `tree` (once, after its tier, before its first reset)."""

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def match(self, key: PrefixKey, admit: bool) -> MatchResult:
        """The tree's match of key: admit, match_prefix's (the node ends at the match, lower tiers
        loaded); else peek_prefix's (nothing moves)."""

    @abstractmethod
    def evict_order(self, node: TreeNode):
        """The sort key of KV eviction among evictable nodes (smallest first)."""

    @abstractmethod
    def leave_l1(self, node: TreeNode) -> None:
        """node's KV is about to leave L1 (its device snapshot cannot stay)."""

    @abstractmethod
    def leave_tree(self, node: TreeNode) -> None:
        """node is about to leave the tree."""

    @abstractmethod
    def before_flush(self) -> None: ...

    @abstractmethod
    def after_flush(self) -> None: ...

    @abstractmethod
    def check(self) -> str | None: ...

    @abstractmethod
    def info(self) -> dict: ...

    # --- the state tracker's calls (keeps_state_snapshots) -------------------------------
    @abstractmethod
    def snapshot_slot(self, node: TreeNode) -> int | None: ...

    @abstractmethod
    def attach_state(
        self, key: PrefixKey, alloc: Callable[[], int | None], from_answer: bool
    ) -> int | None: ...

    @abstractmethod
    def alloc_state(self, superseded_only: bool) -> int | None: ...

    @abstractmethod
    def evict_states(self, n: int, superseded_only: bool) -> int: ...

    @abstractmethod
    def snapshot_count(self) -> int: ...

    @abstractmethod
    def state_slots(self) -> list[int]: ...
