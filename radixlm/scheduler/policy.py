"""Scheduling policies: the order of the waiting queue (admission is admission.py's).

Cache-aware policies look requests up in the radix tree without splitting it and without
writing anything into the requests: the lookup is a hint for ordering only; admission does
the real match and lock.
"""

from __future__ import annotations

import random
from collections import defaultdict

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.tree_node import TreeNode
from radixlm.scheduler.req import Req

# LPM costs a tree walk per waiting request; past this queue length fall back to FCFS.
LPM_MAX_QUEUE = 128


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache: BasePrefixCache, seed: int = 0):
        self.policy = policy
        self.tree_cache = tree_cache
        self.rng = random.Random(seed)

    def calc_priority(self, queue: list[Req]) -> dict[int, int]:
        """Sorts `queue` in place: request priority first (higher first), then the policy.
        Returns the cached prefix length found per request (by id) when the policy looked."""
        policy = self.policy
        if policy in ("lpm", "dfs-weight") and (not self.tree_cache.shares_prefixes or len(queue) > LPM_MAX_QUEUE):
            policy = "fcfs"
        prefix_len: dict[int, int] = {}
        nodes: dict[int, TreeNode] = {}
        if policy in ("lpm", "dfs-weight"):
            for r in queue:
                indices, node = self.tree_cache.peek_prefix(r.prefix_key(r.max_prefix_len()))
                prefix_len[id(r)], nodes[id(r)] = len(indices), node
        if policy == "fcfs":
            queue.sort(key=lambda r: r.arrival_time)
        elif policy == "lpm":
            queue.sort(key=lambda r: (-prefix_len[id(r)], r.arrival_time))
        elif policy == "lof":
            queue.sort(key=lambda r: (-r.sampling_params.max_new_tokens, r.arrival_time))
        elif policy == "random":
            self.rng.shuffle(queue)
        elif policy == "dfs-weight":
            queue[:] = self._dfs_weight_order(queue, nodes)
        # Stable sort: priority dominates, the policy order breaks ties.
        if any(r.priority is not None for r in queue):
            queue.sort(key=lambda r: -(r.priority or 0))
        return prefix_len

    def _dfs_weight_order(self, queue: list[Req], nodes: dict[int, TreeNode]) -> list[Req]:
        """SGLang's dfs-weight: walk the tree depth-first, heavier subtrees (more waiting requests)
        first, a node's own requests after its subtrees', so requests that share a prefix run
        together (deepest match first) while the prefix is cached."""
        root = self.tree_cache.root_node
        by_node: dict[int, list[Req]] = defaultdict(list)
        weight: dict[int, int] = defaultdict(int)
        for r in queue:
            node = nodes[id(r)]
            by_node[id(node)].append(r)
            while node is not None:
                weight[id(node)] += 1
                node = node.parent
        out: list[Req] = []
        stack: list[tuple[TreeNode, bool]] = [(root, False)]  # iterative: a radix tree can be deep
        while stack:
            node, children_done = stack.pop()
            if children_done:
                out.extend(sorted(by_node.get(id(node), []), key=lambda r: r.arrival_time))
                continue
            stack.append((node, True))
            kids = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
            kids.sort(key=lambda c: (-weight[id(c)], c.id))  # heaviest, then oldest node, first
            stack.extend((c, False) for c in reversed(kids))
        return out
