"""MambaRadixCache: the radix tree of a hybrid model, whose nodes may carry state snapshots
(SGLang's name): the tree (radix_cache.py) composed with DeviceSnapshots, this module's snapshot
part (tree_parts.SnapshotPart), and the device-only tier.

A hybrid model's prefix is reusable only where its state layers' states after that prefix were
kept: the attention KV of a longer match is no use without them. A node's snapshot payload
(payloads.StateSnapshot) has the slot of the MambaPool holding the states after the node's last
token. `match_prefix` returns the
longest cached prefix that ends at a snapshot (the root: the empty prefix, zero states); the
attention KV past it is recomputed with the rest of the request (and freed as a duplicate when the
request inserts it). Snapshots enter through `attach_state` (the scheduler's state tracker:
scheduler/kv/state_tracker.py) and leave with their node, or alone when the snapshot slots run
short (`evict_states`, in `snapshot_order`: superseded snapshots, then answers no prompt continued,
then the rest, each least recently used first; never where a lock ends). Leaves without a
snapshot hold KV nothing can reuse alone, so eviction takes them before leaves with one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from radixlm.cache.base_prefix_cache import MatchResult, PrefixKey
from radixlm.cache.kv_events import MEDIUM_GPU_STATE
from radixlm.cache.payloads import StateSnapshot
from radixlm.cache.radix_cache import RadixCache
from radixlm.cache.tree_node import TreeNode, empty_indices, touch, touch_state
from radixlm.cache.tree_parts import SnapshotPart
from radixlm.radix_walk import walk

if TYPE_CHECKING:
    from radixlm.cache.memory_pool import TokenToKVPool
    from radixlm.cache.state_pool import MambaPool


class MambaRadixCache(RadixCache):
    """The tree with DeviceSnapshots over the device-only tier."""

    PARTS = (StateSnapshot,)

    def __init__(self, token_to_kv_pool: TokenToKVPool, state_pool: MambaPool):
        super().__init__(token_to_kv_pool, snapshots=DeviceSnapshots(state_pool))

    @property
    def state_pool(self) -> MambaPool:
        return self.snapshots.state_pool


class DeviceSnapshots(SnapshotPart):
    """Snapshots in the MambaPool's snapshot slots (node.snapshot.slot)."""

    PAYLOAD = StateSnapshot

    def __init__(self, state_pool: MambaPool):
        self.state_pool = state_pool

    def bind(self, tree: RadixCache) -> None:
        self.tree = tree

    def reset(self) -> None:
        pass

    # --- lookup ------------------------------------------------------------------
    def match(self, key: PrefixKey, admit: bool) -> MatchResult:
        """The deepest fully matched node with a snapshot (no split needed: a snapshot ends its
        node); only the path up to it counts as used."""
        root = self.tree.root_node
        best, path, values = root, [], []
        for child, _, m in walk(root, key.token_ids, child_key=key.child_key):
            if m < len(child.key) or child.value is None:
                break
            path.append(child)
            values.append(child.value)
            if child.snapshot.slot is not None:
                best = child
        n = 0
        if best is not root:
            n = path.index(best) + 1
            touch_state(best)
            best.snapshot.from_answer = False  # a prompt continues that answer
        touch(root)
        for node in path[:n]:
            touch(node)
        return MatchResult(torch.cat(values[:n]) if n else empty_indices(), best)

    # --- snapshots ---------------------------------------------------------------
    def snapshot_slot(self, node: TreeNode) -> int | None:
        return node.snapshot.slot

    def attach_state(
        self, key: PrefixKey, alloc: Callable[[], int | None], from_answer: bool
    ) -> int | None:
        """Give the node ending at key (in the tree: just inserted) a snapshot slot from alloc(),
        splitting its edge if key ends inside it; from_answer: the states after a finished answer
        (StateSnapshot.from_answer). -> the slot, or None when the node has a snapshot already or
        no slot was left (nothing changes then)."""
        at = self.tree.locate(key)
        assert at is not None, "attach_state of a key the tree does not hold"
        node, m = at
        if m < len(node.key):
            node = self.tree._split_node(node, m)
        if node is self.tree.root_node:
            return None
        # Ranked below the prompts' snapshots until a prompt continues it, unless this path
        # already continued an earlier answer: a client that sends its answers back as they were.
        from_answer = from_answer and not continues_an_answer(node)
        node.snapshot.ends_answer |= from_answer
        if node.snapshot.slot is not None:
            return None
        slot = alloc()
        if slot is not None:
            node.snapshot.slot = slot
            node.snapshot.from_answer = from_answer
            touch_state(node)
            self.tree.events.snapshot_stored(node, MEDIUM_GPU_STATE)
        return slot

    def alloc_state(self, superseded_only: bool) -> int | None:
        """A free snapshot slot, evicting the first evictable snapshot in eviction order
        (snapshot_order) if none is; superseded_only: evicting only a superseded one."""
        if not self.state_pool.available_snapshots():
            self.evict_states(1, superseded_only)
        return self.state_pool.alloc_snapshot()

    def evict_states(self, n: int, superseded_only: bool) -> int:
        """Drop up to n evictable snapshots (snapshot_evictable) in eviction order (the nodes
        keep their KV)."""
        dropped = 0
        for node in evictable_snapshots(self.tree.all_nodes(), n, superseded_only):
            self._free_state(node)
            dropped += 1
        return dropped

    def _free_state(self, node: TreeNode) -> None:
        self.tree.events.snapshot_removed(node, MEDIUM_GPU_STATE)
        self.state_pool.free_snapshot(node.snapshot.slot)
        node.snapshot.slot = None

    def snapshot_count(self) -> int:
        return sum(1 for n in self.tree.all_nodes() if n.snapshot.slot is not None)

    def state_slots(self) -> list[int]:
        return [n.snapshot.slot for n in self.tree.all_nodes() if n.snapshot.slot is not None]

    # --- the tree's eviction and flush -----------------------------------------------
    def evict_order(self, node: TreeNode) -> tuple[bool, int, int]:
        """Leaves without a snapshot first, each kind least recently used first."""
        return node.snapshot.slot is not None, node.last_access_time, node.id

    def leave_l1(self, node: TreeNode) -> None:
        if node.snapshot.slot is not None:
            self._free_state(node)

    def leave_tree(self, node: TreeNode) -> None:
        pass  # its device snapshot left with its KV (leave_l1)

    def before_flush(self) -> None:
        pass

    def after_flush(self) -> None:
        self.state_pool.clear()

    def check(self) -> str | None:
        return None

    def info(self) -> dict:
        return {}


def snapshot_evictable(node: TreeNode) -> bool:
    """A snapshot is pinned only on a node where a lock ends (a request's match or last node:
    its lock_ref exceeds its children's), not on the ancestors a lock passes through: a running
    request copied its match's snapshot into its row at admission (the copy queued before any
    reuse of the slot) and never reads the others, which a chat's running turns would otherwise
    keep from eviction while the waiting conversations' answers were evicted."""
    return node.lock_ref == sum(c.lock_ref for c in node.children.values())


def superseded(node: TreeNode) -> bool:
    """Whether a deeper snapshot on node's unbranched path down, taken in a prompt (or matched
    by one), stands in for node's: every longer match reaching it ends there instead (an
    interval's snapshot inside a prompt, the one a token before the prompt's end, a chat turn's
    answer that the next turn continued). A branch below node makes it a shared prefix's; an
    answer's snapshot below supersedes nothing until a prompt continues it (a next turn whose
    text re-tokenizes otherwise diverges inside the answer and resumes at its prompt's end)."""
    x = node
    while len(x.children) == 1:
        (x,) = x.children.values()
        if x.snapshot.held():
            return not x.snapshot.from_answer
    return False


def continues_an_answer(node: TreeNode) -> bool:
    """Whether a finished answer ends above node on its path (StateSnapshot.ends_answer)."""
    x = node.parent
    while x is not None:
        if x.snapshot.ends_answer:
            return True
        x = x.parent
    return False


def snapshot_order(node: TreeNode) -> tuple[int, int, int]:
    """The order snapshots leave in: superseded ones (a token or an answer more to recompute if
    one is needed after all), then answers no prompt continued yet (their prompt's snapshot keeps
    all but the answer), then the rest; each kind least recently taken or matched first."""
    kind = 0 if superseded(node) else 1 if node.snapshot.from_answer else 2
    return kind, node.snapshot.access_time, node.id


def evictable_snapshots(nodes: Iterable[TreeNode], n: int, superseded_only: bool) -> list[TreeNode]:
    """Up to n device snapshots to evict, in snapshot_order."""
    heap = [x for x in nodes if x.snapshot.slot is not None and snapshot_evictable(x)]
    picked = heapq.nsmallest(n, heap, key=snapshot_order)
    return [x for x in picked if superseded(x)] if superseded_only else picked
