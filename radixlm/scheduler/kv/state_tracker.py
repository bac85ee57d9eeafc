"""StateTracker: a hybrid model's recurrent states, moved with the requests' KV by the
CacheManager (the one place that moves KV between a request and the tree).

A running request's state lives in the state-pool slot of its ReqToTokenPool row. The tracker
says how it gets there and when it is kept; the copies themselves run at the start of the next
forward, in the order they were asked for (MambaPool.queue_copy, whose queue the tree's host tier
shares; ModelWorkerBatch.state_copies), so that nothing here touches a state a forward in flight
may still be writing:

    admission   the matched prefix ends at a snapshot (or at the root): copy it (or zeros) into
                the row; `Req.state_len` (tokens the row's state has absorbed) = the prefix's
    a step      state_len grows by the request's new tokens; in a prompt's prefill the forward
                keeps the state every --mamba-track-interval positions, at the prompt's end (and
                one token before it) and where it leaves the tree's KV at a branch (admission's
                `Req.state_branch`) in fresh snapshot slots (ModelWorkerBatch.state_tracks),
                owned by the request (`Req.state_tracks`) until its result is processed
    verify      (speculative decoding) the root advances the row; each draft node's state is kept
                in a draft slot (ModelWorkerBatch.state_drafts, `Req.state_draft_slots`); once
                accepted, the last accepted node's slot is copied into the row and state_len is
                the root's and the accepted nodes' (on_verified): a rejected draft never advances
                the row
    cache_req   the tracks the committed KV covers go to their tree nodes (MambaRadixCache's
                attach_state; a node with a snapshot already keeps its own, the slot is freed)
    release     if the row's state is exactly the committed KV's (state_len == committed: no
                step in flight, nothing re-tokenized), it is copied into a snapshot
                at the node ending there; tracks never processed are freed

Attention-only models get NoStateTracker, its no-op sibling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from radixlm.cache.state_pool import ZERO

if TYPE_CHECKING:
    from radixlm.cache.base_prefix_cache import BasePrefixCache
    from radixlm.cache.state_pool import MambaPool
    from radixlm.cache.tree_node import TreeNode
    from radixlm.scheduler.req import Req

# Tokens a snapshot where a prompt leaves the tree's KV must save over its match's own.
BRANCH_MIN = 32

StepStates = tuple[
    list[tuple[int, int]],
    list[list[tuple[int, int]]] | None,
    list[tuple[list[int], list[int]]] | None,
]


class BaseStateTracker(ABC):
    """What the cache manager tells about a request's KV, for the states that go with it."""

    @abstractmethod
    def on_assign(self, req: Req, node: TreeNode) -> None:
        """req was admitted with the prefix ending at node."""

    @abstractmethod
    def plan_step(self, chunks: list, decode_reqs: list[Req], drafts: list | None) -> StepStates:
        """A step's state moves: chunks (batch.py's PrefillChunks: req, start, end, is_last) and
        the decode requests, in batch order; drafts: a verify step's DraftTree per decode request.
        -> (copies, snapshot tracks, draft states)."""

    def on_verified(self, req: Req, path: list[int], kept: int) -> None:
        """req's verify step is processed: its root and the first `kept` nodes of `path` (the
        accepted nodes, in order) are the tokens its state now holds."""

    def takes_in_flight_token(self, req: Req) -> bool:
        """req finishes while a step of it is still in flight (the overlap scheduler's, which ran
        it on its last token before the finish was known): that step writes the token's KV slot
        before any later forward reads it, so the tree may take it, and the row's state after it
        becomes the finished answer's snapshot."""
        return False

    @abstractmethod
    def on_cached(self, req: Req, committed: int) -> None:
        """The tree now holds req's KV up to committed."""

    @abstractmethod
    def on_release(self, req: Req) -> None:
        """req is about to leave its row (its committed KV already in the tree)."""

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def owned_slots(self, holders) -> list[int] | None:
        """Every snapshot slot's owners (the check of invariants.py); None: no state pool."""

    @abstractmethod
    def info(self) -> dict:
        """The state pool's counters for the internal state (/get_server_info)."""


class NoStateTracker(BaseStateTracker):
    """A model without state layers: nothing to move."""

    def on_assign(self, req: Req, node: TreeNode) -> None:
        pass

    def plan_step(self, chunks: list, decode_reqs: list[Req], drafts: list | None) -> StepStates:
        return [], None, None

    def on_cached(self, req: Req, committed: int) -> None:
        pass

    def on_release(self, req: Req) -> None:
        pass

    def flush(self) -> None:
        pass

    def owned_slots(self, holders) -> list[int] | None:
        return None

    def info(self) -> dict:
        return {}


class StateTracker(BaseStateTracker):
    def __init__(self, state_pool: MambaPool, tree: BasePrefixCache, track_interval: int):
        self.pool = state_pool
        self.tree = tree
        # Snapshots serve later matches only through a tree that keeps them.
        self.keeps = tree.capabilities().keeps_state_snapshots
        self.track_interval = track_interval

    def on_assign(self, req: Req, node: TreeNode) -> None:
        slot = self.tree.snapshot_slot(node)
        src = slot if slot is not None else ZERO
        assert src != ZERO or node is self.tree.root_node, "a match ends at a snapshot"
        self.pool.queue_copy(src, req.req_pool_idx)
        req.state_len = req.kv_committed_len
        req.state_tracks = []
        # The tree's KV may run on past the match's snapshot (another prompt's, without one
        # where they part): a snapshot where this one leaves it serves the next prompt sharing
        # that prefix, as a group of questions over one long context.
        req.state_branch = None
        if self.keeps:
            m = self.tree.kv_match(req.prefix_key(req.seqlen))
            shared = len(m.indices)
            # a branch: the tree's KV goes on past `shared` elsewhere (not merely ends there)
            parts = m.last_node.children or shared < depth(m.last_node)
            if parts and req.state_len + BRANCH_MIN <= shared < req.seqlen - 1:
                req.state_branch = shared

    def plan_step(self, chunks: list, decode_reqs: list[Req], drafts: list | None) -> StepStates:
        tracks: list[list[tuple[int, int]]] = []
        for c in chunks:
            r = c.req
            assert r.state_len == c.start, (r.rid, r.state_len, c.start)
            mine = []
            points = self._track_points(c.start, c.end, c.is_last, r.state_branch, r.seqlen)
            for p, ends_prompt in points:
                # An interval's snapshot, soon superseded by the prompt's end below it, may only
                # displace superseded ones: never a whole prefix that another request may reuse.
                slot = self.tree.alloc_state(superseded_only=not ends_prompt)
                if slot is not None:  # no slot left: fewer snapshots, never a stall
                    mine.append((p - c.start, slot))
            mine.sort()
            r.state_tracks += [(c.start + off, slot) for off, slot in mine]
            tracks.append(mine)
            r.state_len = c.end
        for r in decode_reqs:
            r.state_len += 1
            tracks.append([])
        states = None
        if drafts is not None:
            states = []
            for r, d in zip(decode_reqs, drafts):
                assert not r.state_draft_slots, (r.rid, r.state_draft_slots)
                r.state_draft_slots = self.pool.alloc_drafts(len(d))
                r.state_len += len(d)  # the row's state: the root's, until on_verified
                states.append((r.state_draft_slots, list(d.parents)))
        return self.pool.take_copies(), tracks if any(tracks) else None, states

    def on_verified(self, req: Req, path: list[int], kept: int) -> None:
        slots, req.state_draft_slots = req.state_draft_slots, []
        if kept:
            self.pool.queue_copy(slots[path[kept - 1]], req.req_pool_idx)
        # the row holds the root's state (and the accepted path's, once the copy runs)
        req.state_len += kept - len(slots)
        self.pool.release_drafts(slots)

    def _track_points(
        self, start: int, end: int, is_last: bool, branch: int | None, seqlen: int
    ) -> list[tuple[int, bool]]:
        """(position, whether it may displace any snapshot: the prompt's end points, which a
        next turn or a retry resumes at, and the branch point; the intervals may displace only
        superseded ones), in that order of worth, deepest interval first."""
        if not self.keeps:
            return []
        points = []
        if is_last:
            # The prompt's end, for what continues it (the next turn of a chat), and one token
            # before: the same prompt again (a retry, n > 1's copies) must compute its last token
            # for the logits, and text appended to it may merge into its last token.
            points = [(end, True)] + ([(end - 1, True)] if end - 1 > start else [])
        elif end == seqlen - 1:  # the last chunk is the last token alone: one before it is here
            points = [(end, True)]
        if branch is not None and start < branch <= end and branch not in dict(points):
            points.append((branch, True))  # two prompts share it: a group's context
        step = self.track_interval
        if step > 0:
            taken = {p for p, _ in points}
            inside = range((start // step + 1) * step, end + 1, step)
            points += [(p, False) for p in reversed(inside) if p not in taken]
        return points

    def takes_in_flight_token(self, req: Req) -> bool:
        # Else no answer that stops at EOS under overlap leaves a snapshot: its next turn would
        # recompute the whole answer.
        n = req.kv_committed_len + 1
        return self.keeps and req.state_len == req.kv_allocated_len == n == req.seqlen

    def on_cached(self, req: Req, committed: int) -> None:
        # hand the tree the tracks its KV now covers
        keep = []
        for p, slot in req.state_tracks:
            if p > committed:
                keep.append((p, slot))
            elif self.tree.attach_state(req.prefix_key(p), lambda s=slot: s) is None:
                self.pool.free_snapshot(slot)
        req.state_tracks = keep

    def on_release(self, req: Req) -> None:
        for _, slot in req.state_tracks:
            self.pool.free_snapshot(slot)
        req.state_tracks = []
        if req.state_draft_slots:  # a verify step's result never processed (a failed step)
            self.pool.release_drafts(req.state_draft_slots)
            req.state_len = -1  # its row's state is no prefix's: no snapshot below
            req.state_draft_slots = []
        n = req.kv_committed_len
        # The KV past n may be a verify step's rejected nodes (freed with the row), never a step
        # in flight: that one counts in state_len.
        if self.keeps and n and req.state_len == n <= req.kv_allocated_len:
            slot = self.tree.attach_state(
                req.prefix_key(n), self.tree.alloc_state, from_answer=True
            )
            if slot is not None:
                self.pool.queue_copy(req.req_pool_idx, slot)

    def flush(self) -> None:
        self.pool.clear()

    def info(self) -> dict:
        pool = self.pool
        host = pool.host  # the hierarchical cache's host tier of snapshots
        return {
            "state_bytes_per_request": pool.state_bytes,
            "state_rows": pool.rows,
            "state_snapshot_slots": pool.snapshots,
            "state_snapshot_slots_free": pool.available_snapshots(),
            **(
                {
                    "state_host_snapshot_slots": host.size,
                    "state_host_snapshot_slots_free": host.available(),
                }
                if host is not None
                else {}
            ),
        }

    def owned_slots(self, holders) -> list[int]:
        slots = list(self.pool.free_snapshots)
        if self.keeps:
            slots += self.tree.state_slots()
        for r in holders:
            slots += [s for _, s in r.state_tracks]
        return slots + self.pool.free_drafts + [s for r in holders for s in r.state_draft_slots]


def depth(node: TreeNode) -> int:
    """Tokens from the root to node's end."""
    n = 0
    while node.parent is not None:
        n += len(node.key)
        node = node.parent
    return n


def create_state_tracker(
    state_pool: MambaPool | None, tree: BasePrefixCache, track_interval: int
) -> NoStateTracker:
    return (
        NoStateTracker() if state_pool is None else StateTracker(state_pool, tree, track_interval)
    )
