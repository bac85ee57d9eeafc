"""The parts a radix cache is made of beyond the plain tree of KV slots (issue 89): a host tier,
state snapshots, windowed layers' KV. Each part declares the capability it gives its cache
(CACHE_CAPABILITY: a CacheCapabilities field, which the scheduler asks); a part that keeps
something per node has a payload, in its own TreeNode slot (NODE_SLOT), so the nodes of a tree
without that part carry none of its fields. A cache lists its parts in PARTS; its nodes get a
fresh payload of each (TreeNode(parts=...)), and its capabilities are CacheCapabilities.of(PARTS);
the part objects a tree is composed with (tree_parts.py) name the payload they keep (PAYLOAD).
See docs/architecture.md, "Add a cache payload".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


class CachePart:
    # The TreeNode attribute holding this part's payload; None: the part keeps nothing per node.
    NODE_SLOT: ClassVar[str | None] = None
    # The CacheCapabilities field this part sets; None: nothing the scheduler needs to know.
    CACHE_CAPABILITY: ClassVar[str | None] = None

    def split(self, split_len: int) -> CachePart:
        """The payload of the upper node when a node's edge is cut after split_len tokens (this
        one stays with the lower node, which keeps the edge's end)."""
        raise NotImplementedError


@dataclass(eq=False)
class HostSlots(CachePart):
    """The host tier's part of a node (host_tier.py: L2). Its tiers are the cache's own
    business: the scheduler needs no capability for them."""

    NODE_SLOT: ClassVar[str] = "host"

    # The node's KV slots in the host pool (L2); None: not there.
    value: torch.Tensor | None = None
    # Pins the node in L2 while a load or an allocation for it runs (host eviction skips it).
    lock: int = 0
    # Matches through the node: write_through_selective backs it up once it is hot.
    hits: int = 0

    def split(self, split_len: int) -> HostSlots:
        upper = HostSlots(None, self.lock, self.hits)
        if self.value is not None:
            upper.value, self.value = self.value[:split_len], self.value[split_len:]
        return upper


@dataclass(eq=False)
class StateSnapshot(CachePart):
    """A hybrid model's state snapshot at a node (mamba_radix_cache.py): the state layers' states
    after the node's last token, on the device and (hi_mamba_radix_cache.py) the host."""

    NODE_SLOT: ClassVar[str] = "snapshot"
    CACHE_CAPABILITY: ClassVar[str] = "keeps_state_snapshots"

    # The state-pool slot holding the snapshot; None: no snapshot here.
    slot: int | None = None
    # When the snapshot was taken or ended a match (touch_state): a path's other snapshots, which
    # a match passes through (touch), age for snapshot eviction.
    access_time: int = 0
    # Taken after a finished answer (the state tracker's release) and no prompt's match has ended
    # at it since: the next turn's text may re-tokenize the answer otherwise, so it ranks below
    # the prompts' snapshots for eviction.
    from_answer: bool = False
    # A finished answer ended here (kept when the snapshot goes): a later answer below it is on
    # a path whose client sent an answer back as it was.
    ends_answer: bool = False
    # The host slot (HostStatePool) of a copy of the snapshot; None: none on the host.
    host_slot: int | None = None

    def held(self) -> bool:
        """A snapshot on the device or the host."""
        return self.slot is not None or self.host_slot is not None

    def split(self, split_len: int) -> StateSnapshot:
        return StateSnapshot()  # a snapshot ends its node: it stays with the lower part


class WindowedKV(CachePart):
    """The windowed layers' KV (swa_radix_cache.py), evictable apart from the full layers'. Its
    bookkeeping is per KV slot, in the pool (SWATokenToKVPool.has_swa): no node payload."""

    CACHE_CAPABILITY: ClassVar[str] = "tracks_windows"
