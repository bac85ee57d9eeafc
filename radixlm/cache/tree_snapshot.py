"""A read-only picture of a prefix cache's tree for the dashboard (/dashboard/stream): the nodes
holding the most tokens below them, best first from the root, so what is shown is the shared
prefixes that matter. Taken on the scheduler thread between steps, only when a dashboard client
asks (DashboardSnapshotReq): nothing here runs per step, and no lock is held across a step."""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.tree_node import TreeNode

MAX_IDS_PER_NODE = 256  # --dashboard-show-text: a node's text is its first tokens (hover only)


@dataclass(frozen=True)
class SnapshotNode:
    id: int
    parent: int | None  # None: a child of the root
    tokens: int  # tokens on this node's edge
    subtree_tokens: int  # tokens in this node and everything below it
    depth_tokens: int  # tokens from the root to the end of this node (the prefix length)
    lock_ref: int  # running requests reading it (0: evictable)
    lru_rank: int  # 0: the most recently used node of the tree
    children: int  # all its children, shown or not
    tier: str  # "l1" (KV in the pool) or "l2" (hierarchical cache: host memory only)
    namespaced: bool  # under a namespace (LoRA adapter, cache salt): never shared across them
    # A hybrid model's tree: the node keeps a state snapshot, on the device or (hierarchical
    # cache) the host (a match may end here: mamba_radix_cache.py); False elsewhere.
    snapshot: bool
    token_ids: list[int] | None = None


def tree_snapshot(
    cache: BasePrefixCache, max_nodes: int, with_token_ids: bool = False
) -> list[dict]:
    """Up to max_nodes nodes (parents before their children) as dicts."""
    root = cache.root_node
    order: list[TreeNode] = []
    stack = list(root.children.values())
    while stack:  # iterative: a long chat history is a deep tree
        n = stack.pop()
        order.append(n)
        stack.extend(n.children.values())
    if not order or max_nodes <= 0:
        return []
    subtree: dict[int, int] = {}
    for n in reversed(order):  # children come after their parent in `order`
        subtree[n.id] = len(n.key) + sum(subtree[c.id] for c in n.children.values())
    rank = {n.id: i for i, n in enumerate(sorted(order, key=lambda n: -n.last_access_time))}
    depth = {root.id: 0}
    heap = [(-subtree[c.id], c.id, c) for c in root.children.values()]
    heapq.heapify(heap)
    out: list[dict] = []
    while heap and len(out) < max_nodes:
        _, _, n = heapq.heappop(heap)
        depth[n.id] = depth[n.parent.id] + len(n.key)
        out.append(
            asdict(
                SnapshotNode(
                    id=n.id,
                    parent=None if n.parent is root else n.parent.id,
                    tokens=len(n.key),
                    subtree_tokens=subtree[n.id],
                    depth_tokens=depth[n.id],
                    lock_ref=n.lock_ref,
                    lru_rank=rank[n.id],
                    children=len(n.children),
                    tier="l1" if n.value is not None else "l2",
                    namespaced=n.namespace is not None,
                    snapshot=n.snapshot is not None and n.snapshot.held(),
                    token_ids=list(n.key[:MAX_IDS_PER_NODE]) if with_token_ids else None,
                )
            )
        )
        for c in n.children.values():
            heapq.heappush(heap, (-subtree[c.id], c.id, c))
    return out
