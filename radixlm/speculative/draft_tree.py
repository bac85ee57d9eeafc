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

from dataclasses import dataclass, field
from typing import Sequence

ROOT = -1


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False, repr=False, compare=False)  # the root's children: 1

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a draft tree needs one parent per token, got {len(self.tokens)} tokens "
                             f"and {len(self.parents)} parents")
        depths = []
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:
                raise ValueError(f"draft tree node {i}: parent {p} is not the root or an earlier node")
            depths.append(1 if p == ROOT else depths[p] + 1)
        object.__setattr__(self, "depths", tuple(depths))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "DraftTree":
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    @classmethod
    def empty(cls) -> "DraftTree":
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
        """The nodes under `node` (ROOT: the first level), in index order (the order drafts rank them)."""
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
