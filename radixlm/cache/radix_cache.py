"""RadixCache: a radix tree from token-id prefixes to the KV slots that hold them.

Page size 1: every token owns one slot in the TokenToKVPool. A node's `key` is the
run of token ids on its edge and its `value` the int64 slot indices of those tokens,
so the KV of a prefix is the concatenation of the values on its path from the root.

Nodes that a running request still reads are pinned by `lock_ref` (counted on the
whole path, since a request needs every ancestor too). Everything else is evictable,
leaves first, least recently used first. Accounting is kept incrementally:
evictable_size + protected_size == total_size at all times.

The tree knows token ids and slot tensors only; moving KV between a request and the tree
is the scheduler's cache manager's job (scheduler/cache_manager.py).
See docs/architecture.md, "KV ownership".
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.cache.memory_pool import TokenToKVPool

# A global logical clock: strictly increasing, so LRU order is deterministic (two
# nodes touched in one match never tie the way time.monotonic() readings can).
_clock = itertools.count()


def _empty_indices() -> torch.Tensor:
    return torch.empty((0,), dtype=torch.int64)


def _key_match(key0: list[int], key1: list[int]) -> int:
    """Length of the common prefix of two keys."""
    i = 0
    for a, b in zip(key0, key1):
        if a != b:
            break
        i += 1
    return i


class TreeNode:
    _ids = itertools.count()

    def __init__(self) -> None:
        self.id = next(TreeNode._ids)
        self.children: dict[int, TreeNode] = {}  # keyed by the first token of the child's key
        self.parent: TreeNode | None = None
        self.key: list[int] = []
        self.value: torch.Tensor = _empty_indices()
        self.lock_ref = 0
        self.last_access_time = next(_clock)
        # Hierarchical cache (hiradix_cache.py) only: value is None when the node's KV left L1;
        # host_value its slots in the host pool (L2); host_lock pins it there during a load.
        self.host_value: torch.Tensor | None = None
        self.host_lock = 0
        self.hit_count = 0

    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: TreeNode) -> bool:  # for the eviction heap
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref})"


class RadixCache:
    def __init__(self, token_to_kv_pool: TokenToKVPool, disable: bool = False):
        self.token_to_kv_pool = token_to_kv_pool
        self.disable = disable
        self.reset()

    def reset(self) -> None:
        """Drop the whole tree. Slots are not freed here: the caller clears the pools."""
        self.root_node = TreeNode()
        # The root is never evicted and locking stops below it; a permanent ref keeps
        # it out of every "lock_ref == 0" test.
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0

    # --- lookup / insert ---------------------------------------------------------
    def match_prefix(self, key: list[int], split: bool = True) -> tuple[torch.Tensor, TreeNode]:
        """Longest cached prefix of `key`: its KV indices and the node where it ends.

        A match that stops inside an edge splits that node, so the returned node always
        ends exactly at the match and can be locked without pinning unmatched tokens.
        split=False (a lookup for ordering only) leaves the tree as it is; the node is then
        the deepest one the match reached, which may extend past the match.
        """
        if self.disable or len(key) == 0:
            return _empty_indices(), self.root_node
        key = list(key)
        values: list[torch.Tensor] = []
        node = self.root_node
        node.last_access_time = next(_clock)
        while key and key[0] in node.children and self._in_l1(node.children[key[0]]):
            child = node.children[key[0]]
            child.last_access_time = next(_clock)
            prefix_len = _key_match(child.key, key)
            if prefix_len < len(child.key):
                if split:
                    node = self._split_node(child, prefix_len)
                    values.append(node.value)
                else:
                    node = child
                    values.append(child.value[:prefix_len])
                break
            values.append(child.value)
            node = child
            key = key[prefix_len:]
        if not values:
            return _empty_indices(), node
        return torch.cat(values), node

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Insert key -> value. Returns how many leading tokens were already cached.

        The tree keeps its own slots for that prefix; the caller owns (and must free)
        value[:returned_len], which duplicate them.
        """
        if self.disable:
            return 0
        assert len(key) == len(value), f"key/value length mismatch: {len(key)} vs {len(value)}"
        key = list(key)
        node = self.root_node
        node.last_access_time = next(_clock)
        total_prefix_len = 0
        while key:
            child = node.children.get(key[0])
            if child is None:
                # Nothing cached past this point: hang the rest as a new (unlocked) leaf.
                new_node = TreeNode()
                new_node.parent = node
                new_node.key = key
                new_node.value = value.clone()
                node.children[key[0]] = new_node
                self.evictable_size_ += len(key)
                break
            child.last_access_time = next(_clock)
            prefix_len = _key_match(child.key, key)
            total_prefix_len += prefix_len
            if prefix_len < len(child.key):
                child = self._split_node(child, prefix_len)
            node = child
            key = key[prefix_len:]
            value = value[prefix_len:]
        return total_prefix_len

    def continuation(self, key: list[int], k: int, node: TreeNode | None = None) -> list[int]:
        """Up to k cached tokens that follow `key` (read from `node`, default the root), along the
        most recently used children; [] when `key` leaves the tree. Read-only: no split, no
        access-time update (a draft is not a use)."""
        if self.disable or k <= 0:
            return []
        node = node or self.root_node
        out: list[int] = []
        while key:
            child = node.children.get(key[0])
            if child is None:
                return []
            m = _key_match(child.key, key)
            if m < len(key):
                if m < len(child.key):
                    return []
                key, node = key[m:], child
                continue
            out, node, key = child.key[m : m + k], child, []
        while len(out) < k and node.children:
            node = max(node.children.values(), key=lambda c: c.last_access_time)
            out += node.key[: k - len(out)]
        return out

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut `child`'s edge after split_len tokens; return the new upper node.

        The upper half inherits child's lock_ref: every lock that pinned child pinned
        the whole edge, so the sizes (evictable/protected) do not change.
        """
        new_node = TreeNode()
        new_node.parent = child.parent
        new_node.key = child.key[:split_len]
        new_node.lock_ref = child.lock_ref
        new_node.last_access_time = child.last_access_time
        new_node.host_lock, new_node.hit_count = child.host_lock, child.hit_count
        if child.value is not None:
            new_node.value, child.value = child.value[:split_len], child.value[split_len:]
        else:
            new_node.value = None
        if child.host_value is not None:
            new_node.host_value, child.host_value = child.host_value[:split_len], child.host_value[split_len:]
        new_node.children = {child.key[split_len]: child}
        new_node.parent.children[new_node.key[0]] = new_node
        child.parent = new_node
        child.key = child.key[split_len:]
        return new_node

    def match_and_load(self, key: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """Admission's match: with one tier, match_prefix (HiRadixCache also loads lower tiers)."""
        return self.match_prefix(key)

    def flush(self, level: str = "l1") -> None:
        """Drop the whole tree (idle only; the caller clears the pools). HiRadixCache keeps lower tiers."""
        self.reset()

    def check_tiers(self) -> str | None:
        """What is wrong with the lower tiers (HiRadixCache), or None."""
        return None

    @staticmethod
    def _in_l1(node: TreeNode) -> bool:
        """Whether node's KV is in the device pool (always, without the hierarchical cache)."""
        return node.value is not None

    # --- eviction and locking ----------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free LRU unlocked leaves until num_tokens are freed or nothing is evictable."""
        if self.disable or num_tokens <= 0:
            return 0
        leaves = [n for n in self.all_nodes() if n.is_leaf() and n.lock_ref == 0]
        heapq.heapify(leaves)
        num_evicted = 0
        while num_evicted < num_tokens and leaves:
            node = heapq.heappop(leaves)
            self.token_to_kv_pool.free(node.value)
            num_evicted += len(node.value)
            self.evictable_size_ -= len(node.value)
            parent = node.parent
            del parent.children[node.key[0]]
            node.parent = None
            # A parent left childless and unlocked is now an evictable leaf itself.
            if parent.is_leaf() and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        return num_evicted

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pin node and its ancestors. Returns the change in evictable size (<= 0)."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
                delta -= len(node.value)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unpin node and its ancestors. Returns the change in evictable size (>= 0)."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            assert node.lock_ref > 0, f"unbalanced dec_lock_ref on {node}"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
                delta += len(node.value)
            node.lock_ref -= 1
            node = node.parent
        return delta

    # --- sizes and debugging -----------------------------------------------------
    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        # Counted by walking the tree, not from the counters, so it can catch drift. L1 tokens only.
        return sum(len(n.value) for n in self.all_nodes() if n.value is not None)

    def path_to(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        """Token ids and KV slots on the path from the root to `node`."""
        keys, values = [], []
        while node is not self.root_node:
            keys.append(node.key)
            values.append(node.value)
            node = node.parent
        ids = [t for k in reversed(keys) for t in k]
        return ids, torch.cat(values[::-1]) if values else _empty_indices()

    def all_nodes(self) -> list[TreeNode]:
        """Every node except the root."""
        nodes, stack = [], list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    def pretty_print(self) -> None:
        def visit(node: TreeNode, indent: int) -> None:
            for child in node.children.values():
                print(" " * indent + f"{child.key} -> {child.value.tolist() if child.value is not None else 'L2'} lock_ref={child.lock_ref}")
                visit(child, indent + 2)

        visit(self.root_node, 0)
        print(f"total={self.total_size()} evictable={self.evictable_size()} protected={self.protected_size()}")
