"""DraftTree: draft tokens as a tree under a request's last token (EAGLE's and SpecInfer's shape).

Node i carries token `tokens[i]` and hangs under `parents[i]` (-1: the root, which is the request's
last token, already in its sequence). Nodes are in topological order (a parent's index is below its
children's), so a verify step lays the nodes out as query rows 1..n after the root's row 0 and each
row attends the request's prefix plus its own ancestors (the tree mask). A chain is the tree where
node i hangs under node i - 1.

Verification of a tree yields the path of accepted nodes (indices, root excluded) and the target's
own next token after the last of them; that path is what the request keeps (its KV included).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

ROOT = -1
UNBOUNDED = 1 << 30

H = TypeVar("H")


@dataclass(frozen=True)
class TreeShape:
    """Bounds of one step's draft trees (SGLang's flags): at most `width` children per node
    (--speculative-eagle-topk) and `depth` levels below the root (--speculative-num-steps); how many
    nodes in all is the controller's per-request budget (at most --speculative-num-draft-tokens).
    Width 1: chains."""

    width: int = 1
    depth: int = UNBOUNDED


CHAIN = TreeShape()


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False, repr=False, compare=False)  # the root's children: 1

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(
                f"a draft tree needs one parent per token, got {len(self.tokens)} tokens "
                f"and {len(self.parents)} parents"
            )
        depths = []
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:
                raise ValueError(
                    f"draft tree node {i}: parent {p} is not the root or an earlier node"
                )
            depths.append(1 if p == ROOT else depths[p] + 1)
        object.__setattr__(self, "depths", tuple(depths))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    @classmethod
    def empty(cls) -> DraftTree:
        return cls((), ())

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        """The nodes under `node` (ROOT: the first level), in index order (the order drafts rank
        them)."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def ancestors(self, node: int) -> list[int]:
        """node's ancestors from the first level down to node itself (its path from the root)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[i] for i in path]

    @property
    def ranks(self) -> tuple[int, ...]:
        """Each node's place among its siblings (0: its parent's first child)."""
        seen: dict[int, int] = {}
        out = []
        for p in self.parents:
            out.append(seen.get(p, 0))
            seen[p] = out[-1] + 1
        return tuple(out)

    def first_path(self) -> list[int]:
        """The path of first children from the root: the source's best guess (a chain's whole
        draft)."""
        path, node = [], ROOT
        firsts = {p: i for i, p in reversed(list(enumerate(self.parents)))}
        while node in firsts:
            node = firsts[node]
            path.append(node)
        return path

    def select(self, nodes: Iterable[int]) -> DraftTree:
        """The tree of `nodes` (each one's parent among them, or the root), renumbered in index
        order."""
        keep = sorted(set(nodes))
        new = {ROOT: ROOT}
        for i in keep:
            if self.parents[i] not in new:
                raise ValueError(
                    f"draft tree node {i} selected without its parent {self.parents[i]}"
                )
            new[i] = len(new) - 1
        return DraftTree(
            tuple(self.tokens[i] for i in keep), tuple(new[self.parents[i]] for i in keep)
        )

    def bounded(self, shape: TreeShape, max_nodes: int) -> DraftTree:
        """The first max_nodes nodes (index order) within shape: rank below its width, depth within
        its depth."""
        keep: set[int] = set()
        for i, (p, r, d) in enumerate(zip(self.parents, self.ranks, self.depths)):
            if len(keep) == max_nodes:
                break
            if r < shape.width and d <= shape.depth and (p == ROOT or p in keep):
                keep.add(i)
        return self if len(keep) == len(self) else self.select(keep)

    def with_chain(self, under: int, tokens: Sequence[int]) -> DraftTree:
        """This tree with `tokens` hung as a chain under node `under` (ROOT: the root)."""
        parents = list(self.parents)
        for _t in tokens:
            parents.append(under)
            under = len(parents) - 1
        return DraftTree(self.tokens + tuple(tokens), tuple(parents))

    @classmethod
    def grow(
        cls,
        root: H,
        children: Callable[[H], Sequence[tuple[int, float, H]]],
        max_nodes: int,
        shape: TreeShape,
    ) -> DraftTree:
        """Best first: the max_nodes candidates most likely to be reached, a candidate's likelihood
        being the product of its branch shares along its path. children(h) lists (token, weight,
        handle) below a handle; a node's share is its weight over its siblings' total, and only the
        shape.width heaviest siblings are candidates. Shares never exceed 1, so a node comes after
        its parent; heavier siblings come first (a node's children are ranked by index)."""
        order = itertools.count()
        heap: list = []

        def push(h: H, parent: int, depth: int, prob: float) -> None:
            if depth > shape.depth:
                return
            kids = sorted(children(h), key=lambda c: -c[1])
            total = sum(w for _, w, _ in kids)
            for token, w, kid in kids[: shape.width]:
                heapq.heappush(
                    heap,
                    (
                        -prob * w / total if total > 0 else 0.0,
                        next(order),
                        token,
                        parent,
                        depth,
                        kid,
                    ),
                )

        tokens: list[int] = []
        parents: list[int] = []
        push(root, ROOT, 1, 1.0)
        while heap and len(tokens) < max_nodes:
            neg, _, token, parent, depth, kid = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            push(kid, len(tokens) - 1, depth + 1, -neg)
        return cls(tuple(tokens), tuple(parents))


def trie_children(paths: Sequence[tuple[Sequence[int], float]]):
    """A `grow` root and children function over weighted token paths (e.g. what followed each
    earlier occurrence of a context): a trie node is the set of paths through it."""

    def children(h: tuple[int, tuple[int, ...]]) -> list[tuple[int, float, Hashable]]:
        depth, members = h
        groups: dict[int, list[int]] = {}
        for m in members:
            toks = paths[m][0]
            if depth < len(toks):
                groups.setdefault(toks[depth], []).append(m)
        return [
            (t, sum(paths[m][1] for m in ms), (depth + 1, tuple(ms))) for t, ms in groups.items()
        ]

    return (0, tuple(range(len(paths)))), children
