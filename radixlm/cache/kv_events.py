"""KV events: what the radix tree tells cache-aware routers about its blocks (SGLang's
--kv-events-config contract; the schema is radixlm/kv_event_schema.py, the block hashes
radixlm/kv_block_hash.py, the sockets kv_event_publisher.py).

The tree (radix_cache.py, host_tier.py) calls a KVEventSink where its KV changes tier; the sink is
injected (BasePrefixCache.set_kv_events), NoKVEvents when publishing is off. Per medium, a block
is stored once and removed once:

    BlockStored  GPU   a node takes L1 slots (insert, or loaded back from L2)
    BlockRemoved GPU   a node's KV leaves L1 (eviction; the hierarchical cache may keep it in L2)
    BlockStored  CPU_PINNED / BlockRemoved CPU_PINNED   the same for L2 (backup, L3 read; L2
                       eviction, a dropped subtree)
    AllBlocksCleared   the whole tree went (a flush that drops it)

A block is SGLang's page; radixlm's tree is token-granular (SGLang's page size 1), so a block is
one token: block_size 1. One event per tree node (its pages' hashes in order, its tokens), as vLLM
sends them, rather than SGLang's one event per page: the same blocks in a fraction of the bytes.
A node split changes no block, so it sends nothing.

Block hashes are SGLang's: a chain of SHA-256 over each page's token ids (4 bytes little-endian
each) after the previous page's digest, the event carrying the digest's first 8 bytes as a signed
int64 (hash_str_to_int64). A prefix in a namespace (a LoRA adapter's, a tenant's) starts its chain
from a digest of the namespace, so equal tokens in two namespaces are different blocks.

A hybrid model's state snapshots (a match may end only at one) are blocks of media of their own,
the snapshot's position named as its KV is (SGLang 0.5.10's hybrid trees publish nothing at all;
its schema's `medium` is a free string, so its subscribers decode these unchanged and one that
indexes per medium keeps them apart):

    BlockStored  GPU_STATE   a node takes a device snapshot (the states after its last token):
                 block_hashes [the hash of that token's block], token_ids [the token],
                 parent_block_hash the block before it (a GPU-medium block, not a state)
    BlockRemoved GPU_STATE   the device snapshot is dropped (snapshot eviction, its node
                             evicted, or moved down to the host)
    BlockStored / BlockRemoved CPU_PINNED_STATE   the same for a host copy (the hierarchical
                             cache of a hybrid)

A router reuses a hybrid worker's prefix only up to its deepest GPU_STATE block along the request
(what match_prefix returns); a node split moves no snapshot (it stays with the last token), so it
sends nothing. Not published: a sliding-window layer's slots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from radixlm.kv_block_hash import chain_digests, int64_of, namespace_seed

if TYPE_CHECKING:
    from radixlm.cache.tree_node import TreeNode

MEDIUM_GPU = "GPU"  # L1, the KV pool (SGLang's name for it, on a CPU engine too)
MEDIUM_CPU = "CPU_PINNED"  # L2, the hierarchical cache's host pool
MEDIUM_GPU_STATE = "GPU_STATE"  # a hybrid's device state snapshots (the MambaPool's)
MEDIUM_CPU_STATE = "CPU_PINNED_STATE"  # their host copies (HostStatePool)
BLOCK_SIZE = 1  # tokens per block: the tree's page size


class KVEventSink(ABC):
    """What the tree calls as its KV moves (see the module docstring for when)."""

    @abstractmethod
    def stored(self, nodes: list[TreeNode], medium: str) -> None:
        """nodes (each below the previous one, or siblings' paths in order) now hold KV in
        medium."""

    @abstractmethod
    def removed(self, node: TreeNode, medium: str) -> None:
        """node's KV is about to leave medium (the node is still linked)."""

    @abstractmethod
    def snapshot_stored(self, node: TreeNode, medium: str) -> None:
        """node now holds a state snapshot in medium (MEDIUM_GPU_STATE / MEDIUM_CPU_STATE)."""

    @abstractmethod
    def snapshot_removed(self, node: TreeNode, medium: str) -> None:
        """node's snapshot is about to leave medium."""

    @abstractmethod
    def cleared(self) -> None:
        """The whole tree was dropped."""

    @abstractmethod
    def forget(self, node: TreeNode) -> None:
        """node left the tree (its removals were sent)."""

    @abstractmethod
    def take(self) -> list:
        """The events since the last take, oldest first."""


class NoKVEvents(KVEventSink):
    """Publishing off: nothing is recorded."""

    def stored(self, nodes: list[TreeNode], medium: str) -> None:
        pass

    def removed(self, node: TreeNode, medium: str) -> None:
        pass

    def snapshot_stored(self, node: TreeNode, medium: str) -> None:
        pass

    def snapshot_removed(self, node: TreeNode, medium: str) -> None:
        pass

    def cleared(self) -> None:
        pass

    def forget(self, node: TreeNode) -> None:
        pass

    def take(self) -> list:
        return []


NO_KV_EVENTS = NoKVEvents()


class KVEventRecorder(KVEventSink):
    """Publishing on: events as SGLang's structs (kv_event_schema.py), with each node's block
    hashes kept while it is in the tree (node id -> (edge length, int64 hashes, last digest); a
    split node's length no longer matches, so its halves are rehashed from their parent)."""

    def __init__(self) -> None:
        from radixlm import kv_event_schema as schema

        self.schema = schema
        self.events: list = []
        self._hashes: dict[int, tuple[int, list[int], bytes]] = {}

    def _memo(self, node: TreeNode) -> tuple[int, list[int], bytes] | None:
        m = self._hashes.get(node.id)
        return m if m is not None and m[0] == len(node.key) else None

    def hashes(self, node: TreeNode) -> list[int]:
        """node's block hashes (the chain from the root computed where not kept)."""
        path = []
        n: TreeNode | None = node
        while n is not None and n.parent is not None and self._memo(n) is None:
            path.append(n)
            n = n.parent
        prior = self._memo(n)[2] if n is not None and n.parent is not None else None
        for n in reversed(path):
            digests = chain_digests(n.key, namespace_seed(n.namespace) if prior is None else prior)
            self._hashes[n.id] = (len(n.key), [int64_of(d) for d in digests], digests[-1])
            prior = digests[-1]
        return self._hashes[node.id][1]

    def _parent_hash(self, node: TreeNode) -> int | None:
        parent = node.parent
        return None if parent is None or parent.parent is None else self.hashes(parent)[-1]

    def stored(self, nodes: list[TreeNode], medium: str) -> None:
        for n in nodes:
            self.events.append(
                self.schema.BlockStored(
                    block_hashes=list(self.hashes(n)),
                    parent_block_hash=self._parent_hash(n),
                    token_ids=list(n.key),
                    block_size=BLOCK_SIZE,
                    lora_id=None,
                    medium=medium,
                )
            )

    def removed(self, node: TreeNode, medium: str) -> None:
        self.events.append(
            self.schema.BlockRemoved(block_hashes=list(self.hashes(node)), medium=medium)
        )

    def snapshot_stored(self, node: TreeNode, medium: str) -> None:
        hashes = self.hashes(node)
        parent = hashes[-2] if len(hashes) > 1 else self._parent_hash(node)
        self.events.append(
            self.schema.BlockStored(
                block_hashes=[hashes[-1]],
                parent_block_hash=parent,
                token_ids=[node.key[-1]],
                block_size=BLOCK_SIZE,
                lora_id=None,
                medium=medium,
            )
        )

    def snapshot_removed(self, node: TreeNode, medium: str) -> None:
        self.events.append(
            self.schema.BlockRemoved(block_hashes=[self.hashes(node)[-1]], medium=medium)
        )

    def cleared(self) -> None:
        self._hashes.clear()
        self.events.append(self.schema.AllBlocksCleared())

    def forget(self, node: TreeNode) -> None:
        self._hashes.pop(node.id, None)

    def take(self) -> list:
        events, self.events = self.events, []
        return events
