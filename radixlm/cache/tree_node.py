"""TreeNode: a node of the KV cache's radix tree (radix_cache.py, and the caches composed from it:
hiradix_cache.py, mamba_radix_cache.py, hi_mamba_radix_cache.py, swa_radix_cache.py): the tree's
own fields, and a payload slot per part of the cache that keeps something per node (payloads.py)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import torch

from radixlm.cache.payloads import CachePart, HostSlots, StateSnapshot

# A global logical clock: strictly increasing, so LRU order is deterministic (two
# nodes touched in one match never tie the way time.monotonic() readings can).
_clock = itertools.count()


def empty_indices() -> torch.Tensor:
    return torch.empty((0,), dtype=torch.int64)


# The payload slots of TreeNode, one per CachePart that keeps something per node (NODE_SLOT).
PAYLOAD_SLOTS = ("host", "snapshot")


class TreeNode:
    # Slots: a field no part declares cannot be set by mistake (a variant's old field name).
    __slots__ = (
        "id",
        "children",
        "parent",
        "key",
        "value",
        "namespace",
        "lock_ref",
        "last_access_time",
        "insert_count",
        *PAYLOAD_SLOTS,
    )
    _ids = itertools.count()

    def __init__(
        self,
        key: list[int] | None = None,
        value: torch.Tensor | None = None,
        namespace: Hashable | None = None,
        parts: tuple[type[CachePart], ...] = (),
    ) -> None:
        self.id = next(TreeNode._ids)
        self.children: dict[Hashable, TreeNode] = {}  # keyed by lookup_key() of the child
        self.parent: TreeNode | None = None
        self.key: list[int] = key if key is not None else []
        # KV slots in the pool (L1); None: the KV left L1 (hierarchical cache: it is in host.value).
        self.value: torch.Tensor | None = value if value is not None else empty_indices()
        self.namespace = namespace
        self.lock_ref = 0
        self.last_access_time = next(_clock)
        # Inserts that passed through this node (each request inserts its prompt after prefill and
        # prompt + output when it finishes): how often this branch was taken, radix drafts' weight.
        self.insert_count = 0
        # The payloads of the tree's parts (payloads.py), None where the tree has no such part.
        self.host: HostSlots | None = None
        self.snapshot: StateSnapshot | None = None
        for part in parts:
            if part.NODE_SLOT is not None:
                setattr(self, part.NODE_SLOT, part())

    def split_payloads(self, upper: TreeNode, split_len: int) -> None:
        """Give upper, the node cut from this one's first split_len tokens, its payloads."""
        for slot in PAYLOAD_SLOTS:
            part = getattr(self, slot)
            if part is not None:
                setattr(upper, slot, part.split(split_len))

    def lookup_key(self) -> Hashable:
        """The key of this node in its parent's children: its first token (and its namespace)."""
        return self.key[0] if self.namespace is None else (self.namespace, self.key[0])

    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: TreeNode) -> bool:  # for the eviction heap
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref})"


def touch(node: TreeNode) -> None:
    node.last_access_time = next(_clock)


def touch_state(node: TreeNode) -> None:
    node.snapshot.access_time = next(_clock)


def state_lru(node: TreeNode) -> tuple[int, int]:
    """The order snapshots are evicted in: least recently taken or matched first."""
    return node.snapshot.access_time, node.id
