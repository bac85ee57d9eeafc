"""TreeNode: a node of the KV cache's radix trees (radix_cache.py, hiradix_cache.py,
mamba_radix_cache.py, hi_mamba_radix_cache.py)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import torch

# A global logical clock: strictly increasing, so LRU order is deterministic (two
# nodes touched in one match never tie the way time.monotonic() readings can).
_clock = itertools.count()


def empty_indices() -> torch.Tensor:
    return torch.empty((0,), dtype=torch.int64)


class TreeNode:
    _ids = itertools.count()

    def __init__(
        self,
        key: list[int] | None = None,
        value: torch.Tensor | None = None,
        namespace: Hashable | None = None,
    ) -> None:
        self.id = next(TreeNode._ids)
        self.children: dict[Hashable, TreeNode] = {}  # keyed by lookup_key() of the child
        self.parent: TreeNode | None = None
        self.key: list[int] = key if key is not None else []
        # KV slots in the pool (L1); None: the KV left L1 (hierarchical cache: it is in host_value).
        self.value: torch.Tensor | None = value if value is not None else empty_indices()
        self.namespace = namespace
        self.lock_ref = 0
        self.last_access_time = next(_clock)
        # Hierarchical cache (hiradix_cache.py) only: host_value its slots in the host pool (L2);
        # host_lock pins it there during a load; hit_count drives write_through_selective.
        self.host_value: torch.Tensor | None = None
        self.host_lock = 0
        self.hit_count = 0
        # Inserts that passed through this node (each request inserts its prompt after prefill and
        # prompt + output when it finishes): how often this branch was taken, radix drafts' weight.
        self.insert_count = 0
        # A hybrid model's cache (mamba_radix_cache.py) only: the state-pool slot holding the state
        # layers' states after this node's last token; None: no snapshot here.
        self.state: int | None = None
        # When that snapshot was taken or ended a match (touch_state): a path's other snapshots,
        # which a match passes through (touch), age for snapshot eviction.
        self.state_access_time = 0
        # Whether that snapshot was taken after a finished answer (the state tracker's release)
        # and no prompt's match has ended at it since: the next turn's text may re-tokenize the
        # answer otherwise, so it ranks below the prompts' snapshots for eviction.
        self.state_from_answer = False
        # Whether a finished answer ended here (kept when the snapshot goes): a later answer
        # below it is on a path whose client sent an answer back as it was.
        self.ends_answer = False
        # The hierarchical cache of a hybrid model (hi_mamba_radix_cache.py) only: the host slot
        # (HostStatePool) of a copy of that snapshot; None: none on the host.
        self.host_state: int | None = None

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
    node.state_access_time = next(_clock)


def state_lru(node: TreeNode) -> tuple[int, int]:
    """The order snapshots are evicted in: least recently taken or matched first."""
    return node.state_access_time, node.id
