"""The one descent of a radix tree, shared by every tree of radixlm: the KV cache's (token ids,
cache/radix_cache.py, cache/hiradix_cache.py) and the router's (characters, router/tree.py).

A tree is made of nodes with a `key` (the run of items on the edge into the node: a list of
token ids or a string) and `children` (a dict from a child's lookup key to the child). The lookup
key of a child is its first item, or what `child_key` makes of it (the KV cache adds a namespace
there, so that the same tokens under two adapters never share a node).

A leaf module: it imports nothing of radixlm and no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence


def edge_match(edge: Sequence, key: Sequence, pos: int) -> int:
    """How many leading items of `edge` equal key[pos:] (slices compare at C speed; a binary search
    over them where they differ, instead of a Python loop per item)."""
    n = min(len(edge), len(key) - pos)
    if edge[:n] == key[pos : pos + n]:
        return n
    lo, hi = 0, n  # edge[:lo] == key[pos:pos + lo], edge[:hi] != key[pos:pos + hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if edge[lo:mid] == key[pos + lo : pos + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def walk(
    node, key: Sequence, pos: int = 0, child_key: Callable[[object], Hashable] | None = None
) -> Iterator[tuple[object, int, int]]:
    """Follow key[pos:] down from `node`. For every child entered yields (child, pos, m): the
    child's edge matched m >= 1 items of key from position pos. The walk ends after a child matched
    only part of its edge (m < len(child.key)), where no child continues the key, or at the end of
    the key.

    The caller may split the child it was handed at m (the walk ends after a partial match anyway);
    any other change to the tree ends the iteration."""
    children_of = node.children
    while pos < len(key):
        first = key[pos]
        child = children_of.get(first if child_key is None else child_key(first))
        if child is None:
            return
        m = edge_match(child.key, key, pos)
        partial = m < len(child.key)
        yield child, pos, m
        if partial:  # decided before the yield: the caller may split that edge meanwhile
            return
        pos += m
        children_of = child.children
