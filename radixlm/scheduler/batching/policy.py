"""Scheduling policies: the order of the waiting queue (admission is admission.py's).

Cache-aware policies look requests up in the radix tree without splitting it and without
writing anything into the requests: the lookup is a hint for ordering only; admission does
the real match and lock.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.tree_node import TreeNode
from radixlm.registry import Registry
from radixlm.scheduler.req import Req

# LPM costs a tree walk per waiting request; past this queue length fall back to FCFS.
LPM_MAX_QUEUE = 128


@dataclass
class Lookup:
    """What a cache-aware policy found for each waiting request (by id): its cached prefix length
    and the tree node the match reached. Empty for other policies."""

    prefix_len: dict[int, int] = field(default_factory=dict)
    nodes: dict[int, TreeNode] = field(default_factory=dict)


# order(policy, queue, lookup): sorts queue in place (ties keep arrival order).
Order = Callable[["SchedulePolicy", list[Req], Lookup], None]


@dataclass(frozen=True)
class PolicyInfo:
    cache_aware: bool = False  # looks every waiting request up in the tree first


SCHEDULE_POLICY_REGISTRY = Registry[Order, PolicyInfo](
    "schedule policy", unknown="schedule_policy must be one of {choices}, got {name!r}"
)
_REGISTRY = SCHEDULE_POLICY_REGISTRY  # its former name (tests unregister their example through it)


def register_policy(name: str, cache_aware: bool = False) -> Callable[[Order], Order]:
    """--schedule-policy NAME: a function that orders the waiting queue in place."""
    return SCHEDULE_POLICY_REGISTRY.register(name, meta=PolicyInfo(cache_aware))


def is_cache_aware(policy: str) -> bool:
    """The policy orders by shared prefixes (admission then holds back a request whose prefix
    another admitted request is computing: it hits the cache next round)."""
    return SCHEDULE_POLICY_REGISTRY.meta(policy).cache_aware


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache: BasePrefixCache, seed: int = 0):
        self.policy = policy
        self.tree_cache = tree_cache
        self.rng = random.Random(seed)

    def calc_priority(self, queue: list[Req]) -> dict[int, int]:
        """Sorts `queue` in place: request priority first (higher first), then the policy.
        Returns the cached prefix length found per request (by id) when the policy looked."""
        name = self.policy
        if is_cache_aware(name) and (
            not self.tree_cache.capabilities().shares_prefixes or len(queue) > LPM_MAX_QUEUE
        ):
            name = "fcfs"
        lookup = Lookup()
        if is_cache_aware(name):
            for r in queue:
                indices, node = self.tree_cache.peek_prefix(r.prefix_key(r.max_prefix_len()))
                lookup.prefix_len[id(r)], lookup.nodes[id(r)] = len(indices), node
        SCHEDULE_POLICY_REGISTRY.get(name)(self, queue, lookup)
        # Stable sort: priority dominates, the policy order breaks ties.
        if any(r.priority is not None for r in queue):
            queue.sort(key=lambda r: -(r.priority or 0))
        return lookup.prefix_len

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


# --schedule-policy, its choices in this order: longest prefix match, first come first served,
# SGLang's dfs-weight, longest output first, random.
@register_policy("lpm", cache_aware=True)
def longest_prefix_match(policy: SchedulePolicy, queue: list[Req], lookup: Lookup) -> None:
    queue.sort(key=lambda r: (-lookup.prefix_len[id(r)], r.arrival_time))


@register_policy("fcfs")
def first_come_first_served(policy: SchedulePolicy, queue: list[Req], lookup: Lookup) -> None:
    queue.sort(key=lambda r: r.arrival_time)


@register_policy("dfs-weight", cache_aware=True)
def dfs_weight(policy: SchedulePolicy, queue: list[Req], lookup: Lookup) -> None:
    queue[:] = policy._dfs_weight_order(queue, lookup.nodes)


@register_policy("lof")
def longest_output_first(policy: SchedulePolicy, queue: list[Req], lookup: Lookup) -> None:
    queue.sort(key=lambda r: (-r.sampling_params.max_new_tokens, r.arrival_time))


@register_policy("random")
def random_order(policy: SchedulePolicy, queue: list[Req], lookup: Lookup) -> None:
    policy.rng.shuffle(queue)
