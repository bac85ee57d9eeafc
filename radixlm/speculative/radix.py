"""Drafts from the radix tree: what other requests computed after the same context.

The tree holds every recently computed token sequence (prompts, and the outputs of finished
requests). A running request's tokens walk down from its locked node; where they end, the
continuation along the most recently used children is the draft: a request that repeats an
earlier one (an agent's recurring call, a retried prompt, n > 1 samples) gets the earlier
answer proposed token for token, and pays for verifying it only where it diverges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.cache.radix_cache import RadixCache
    from radixlm.scheduler.req import Req


class RadixDraftSource:
    def __init__(self, tree_cache: "RadixCache"):
        if tree_cache.disable:
            raise ValueError("speculative_algorithm radix drafts from the radix cache: it is disabled")
        self.tree = tree_cache

    def propose(self, req: "Req", k: int) -> list[int]:
        node = req.last_node if req.last_node is not None else self.tree.root_node
        start = req.cache_protected_len if req.last_node is not None else 0
        return self.tree.continuation(req.all_ids()[start:], k, node)

    def release(self, rid: str) -> None:
        pass
