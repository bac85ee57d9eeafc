"""An approximate, multi-tenant radix tree over request text (SGLang router's cache-aware tree).

The router never sees a worker's KV cache; it remembers which texts it sent where. Each node is
an edge of characters; `tenants` maps every worker whose requests passed through the node to the
last time one did. A tenant on a node is on all of its ancestors, so a worker's share of a
request is the depth of the deepest matched node it is on. The tree is trimmed per tenant, least
recently used leaves first, to `max_tree_size` characters (the worker's own cache forgets old
prefixes too; the router's picture should not outlive them by much). The descent is
radix_walk.walk, the one shared with the KV cache's trees.
"""

from __future__ import annotations

import heapq
import itertools
import time

from radixlm.radix_walk import walk


class _Node:
    # `key`/`children`: the node shape radix_walk.walk descends.
    __slots__ = ("key", "parent", "children", "tenants")

    def __init__(self, key: str, parent: _Node | None):
        self.key = key  # the characters on the edge into this node
        self.parent = parent
        self.children: dict[str, _Node] = {}  # first character -> child
        self.tenants: dict[str, float] = {}  # tenant -> last access


class ApproxRadixTree:
    def __init__(self):
        self.root = _Node("", None)
        self.tenant_chars: dict[str, int] = {}  # characters each tenant holds
        self._clock = itertools.count()  # tie-breaker: insertions in one clock tick stay ordered

    def _now(self, now: float | None) -> float:
        return time.monotonic() if now is None else now

    def insert(self, text: str, tenant: str, now: float | None = None) -> None:
        """Record that `tenant` served `text` (it now caches every prefix of it)."""
        t = self._now(now)
        node, end = self.root, 0
        self._touch(node, tenant, t)
        for child, pos, m in walk(self.root, text):
            split = m < len(child.key)
            if split:
                child = self._split(child, m)
            self._touch(child, tenant, t)
            node, end = child, pos + m
            if split:  # the walk would end here anyway; stop before it looks at the edge just cut
                break
        if end < len(text):
            leaf = _Node(text[end:], node)
            node.children[text[end]] = leaf
            self._touch(leaf, tenant, t)

    def _touch(self, node: _Node, tenant: str, t: float) -> None:
        if tenant not in node.tenants:
            self.tenant_chars[tenant] = self.tenant_chars.get(tenant, 0) + len(node.key)
        node.tenants[tenant] = t

    def _split(self, child: _Node, n: int) -> _Node:
        """child's edge cut after n characters: returns the new upper node (same tenants)."""
        parent = child.parent
        upper = _Node(child.key[:n], parent)
        upper.tenants = dict(child.tenants)
        parent.children[child.key[0]] = upper
        child.key = child.key[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def prefix_match(self, text: str, now: float | None = None) -> tuple[int, list[str]]:
        """(characters of text's longest cached prefix, the tenants that hold all of it). The
        match may end inside an edge. Touches the matched path for those tenants."""
        path, end = [], 0
        for child, pos, m in walk(self.root, text):
            path.append(child)
            end = pos + m
        if not path:
            return 0, []
        tenants = list(path[-1].tenants)
        t = self._now(now)
        for nd in path:
            for tenant in tenants:
                nd.tenants[tenant] = t
        return end, tenants

    def prefix_match_tenant(self, text: str, tenant: str) -> int:
        """Characters of text's longest prefix that `tenant` holds."""
        end = 0
        for child, pos, m in walk(self.root, text):
            if tenant not in child.tenants:  # a tenant is on every ancestor: nothing deeper is its
                break
            end = pos + m
        return end

    def remove_tenant(self, tenant: str) -> None:
        """Forget everything `tenant` held (a worker removed or dead)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            node.tenants.pop(tenant, None)
            stack.extend(node.children.values())
        self._prune(self.root)
        self.tenant_chars.pop(tenant, None)

    def _prune(self, node: _Node) -> None:
        for key, child in list(node.children.items()):
            if child.tenants:
                self._prune(child)
            else:
                del node.children[key]

    def evict_tenant_by_size(self, max_size: int) -> dict[str, int]:
        """Trim every tenant above max_size characters, its least recently used leaves first.
        Returns the characters removed per tenant."""
        removed: dict[str, int] = {}
        for tenant, chars in list(self.tenant_chars.items()):
            if chars <= max_size:
                continue
            heap = [
                (nd.tenants[tenant], next(self._clock), nd) for nd in self._tenant_leaves(tenant)
            ]
            heapq.heapify(heap)
            while heap and self.tenant_chars[tenant] > max_size:
                _, _, node = heapq.heappop(heap)
                del node.tenants[tenant]
                self.tenant_chars[tenant] -= len(node.key)
                removed[tenant] = removed.get(tenant, 0) + len(node.key)
                parent = node.parent
                if not node.tenants and parent is not None:
                    del parent.children[node.key[0]]
                if (
                    parent is not self.root
                    and parent is not None
                    and not any(tenant in c.tenants for c in parent.children.values())
                ):
                    heapq.heappush(heap, (parent.tenants[tenant], next(self._clock), parent))
        return removed

    def _tenant_leaves(self, tenant: str) -> list[_Node]:
        out, stack = [], [c for c in self.root.children.values() if tenant in c.tenants]
        while stack:
            node = stack.pop()
            kids = [c for c in node.children.values() if tenant in c.tenants]
            if kids:
                stack.extend(kids)
            else:
                out.append(node)
        return out

    def size(self) -> int:
        """Nodes in the tree (the root excluded)."""
        n, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.children.values())
        return n
