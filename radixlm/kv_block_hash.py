"""KV events' block hashes, SGLang's (mem_cache: get_hash_str, hash_str_to_int64) with one-token
pages: a chain of SHA-256 digests, each over the previous page's digest and the page's token id
(4 bytes little-endian); an event carries a digest's first 8 bytes as a signed int64.

A leaf: the tree's recorder (cache/kv_events.py) hashes the blocks it publishes with it, and the
router (router/kv_index.py) hashes a request's tokens with it to look them up in what the workers
published."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable


def int64_of(digest: bytes) -> int:
    """SGLang's hash_str_to_int64: the digest's first 8 bytes, big-endian, signed."""
    return int.from_bytes(digest[:8], "big", signed=True)


def chain_digests(token_ids: list[int], prior: bytes) -> list[bytes]:
    """SHA-256 digests of consecutive one-token pages, each over the previous digest and the
    page's token (SGLang's get_hash_str with page size 1)."""
    out = []
    for t in token_ids:
        prior = hashlib.sha256(prior + t.to_bytes(4, "little")).digest()
        out.append(prior)
    return out


def namespace_seed(namespace: Hashable | None) -> bytes:
    """Where a prefix's chain starts: nothing (SGLang's chain) in the common namespace."""
    if namespace is None:
        return b""
    return hashlib.sha256(repr(namespace).encode()).digest()


def block_hashes(token_ids: list[int]) -> list[int]:
    """The int64 hashes of a prompt's blocks in the common namespace, as its events carry them."""
    return [int64_of(d) for d in chain_digests(token_ids, b"")]
