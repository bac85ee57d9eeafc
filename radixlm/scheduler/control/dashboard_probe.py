"""The scheduler's side of the dashboard: it answers DashboardSnapshotReq (the internal state and
a tree snapshot) when one arrives, and does nothing else. The server sends one per tick only
while a /dashboard/stream client is connected, so with nobody watching the scheduler's steps pay
nothing; `dashboard_snapshots` (in the internal state) counts the answers, which is how that is
checked."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.tree_snapshot import tree_snapshot
from radixlm.ipc import DashboardSnapshotReq, DashboardSnapshotReqOutput

MAX_NODES = 512  # a bound on what one answer carries, whatever the request asks


class DashboardProbe:
    def __init__(self, tree_cache: BasePrefixCache, internal_state: Callable[[], dict]):
        self.tree_cache = tree_cache
        self.internal_state = internal_state
        self.snapshots = 0

    def handle(self, msg: DashboardSnapshotReq) -> DashboardSnapshotReqOutput:
        self.snapshots += 1
        tree = tree_snapshot(
            self.tree_cache, min(max(msg.max_nodes, 0), MAX_NODES), msg.with_token_ids
        )
        return DashboardSnapshotReqOutput(self.internal_state(), tree)

    def info(self) -> dict:
        return {"dashboard_snapshots": self.snapshots}
