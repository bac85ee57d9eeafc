"""Drafts from the radix tree: what other requests computed after the same context.

The tree holds every recently computed token sequence (prompts, and the outputs of finished
requests). A running request's tokens walk down from its locked node; where they end, the
continuation along the most recently used children is the draft: a request that repeats an
earlier one (an agent's recurring call, a retried prompt, n > 1 samples) gets the earlier
answer proposed token for token, and pays for verifying it only where it diverges.

Where several requests went on differently after the same context (sampled answers, an agent's
branching calls), the recorded branches become a draft tree (draft_tree.py): best first by how
often each branch was taken (TreeNode.insert_count, the most recent first on a tie), at most the
step's width of branches per node. The first path is the chain the source would draft alone.

The tree drafts only while the request's whole chain is cached. Where it gives fewer than k
tokens (the request left the tree, or its chain ends), a SuffixIndex of recent outputs
(suffix_index.py) continues from the request's last tokens: answers that repeat in pieces after
a different prompt, or after the tree evicted them. Where the tree has nothing, prompt lookup over
the request's own tokens (ngram.py) competes with the index: the longer context match drafts (a
request's own text on a tie). So the first occurrence of a prompt drafts what it copies from
itself, as the ngram source would. draft_class tells the controller which kind a request would get
("recorded": the tree continues its whole context; "lookup": the rest), since their acceptance
rates differ by far (controller.py learns one per class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.ipc import FinishAbort
from radixlm.speculative.draft_source import DraftReq, PerRequestDraftSource
from radixlm.speculative.draft_tree import CHAIN, ROOT, DraftTree, TreeShape

if TYPE_CHECKING:
    from radixlm.cache.radix_cache import RadixCache
    from radixlm.speculative.ngram import NgramDraftSource
    from radixlm.speculative.suffix_index import SuffixIndex


class RadixDraftSource(PerRequestDraftSource):
    def __init__(
        self,
        tree_cache: RadixCache,
        suffix_index: SuffixIndex | None = None,
        lookup: NgramDraftSource | None = None,
    ):
        if not tree_cache.capabilities().shares_prefixes:
            raise ValueError(
                "speculative_algorithm radix drafts from the radix cache: it is disabled"
            )
        self.tree = tree_cache
        self.suffix = suffix_index  # None: no index of recent outputs
        self.lookup = lookup  # None: no prompt lookup

    def draft_class(self, req: DraftReq) -> str:
        """ "recorded": the tree holds a continuation of req's whole context (an earlier answer to
        the same call), accepted far more often than the index's or a lookup's guesses ("lookup").
        """
        at = self._locate(req)
        return (
            "recorded" if at is not None and self._branches(at, req.cache_namespace) else "lookup"
        )

    def _locate(self, req: DraftReq) -> tuple | None:
        """Where req's tokens end in the tree (grow's handle), or None where they leave it."""
        node = req.last_node if req.last_node is not None else self.tree.root_node
        start = req.cache_protected_len if req.last_node is not None else 0
        return self.tree.locate(PrefixKey(req.all_ids()[start:], req.cache_namespace), node)

    def draft_for(self, req: DraftReq, k: int, shape: TreeShape = CHAIN) -> DraftTree:
        ids = req.all_ids()
        at = self._locate(req)
        tree = (
            DraftTree.empty()
            if at is None
            else DraftTree.grow(at, lambda h: self._branches(h, req.cache_namespace), k, shape)
        )
        if len(tree) == k:
            return tree
        main = tree.first_path()
        more, match = [], 0
        if self.suffix is not None:
            # The index continues the context as the tree's first path extends it.
            context = ids[-self.suffix.max_match :] + tree.path_tokens(main)
            more, match = self.suffix.propose_with_match(context, k - len(tree))
        if not len(tree) and self.lookup is not None:
            own, own_match = self.lookup.lookup_tree(req.rid, ids, k, shape)
            if own_match >= match and len(own):
                return own
        return tree.with_chain(main[-1] if main else ROOT, more)

    def _branches(self, h: tuple, namespace) -> list[tuple]:
        """grow's children below (node, m), a point m tokens into node's edge: the edge's next
        token, or at its end each branch weighted by how often it was taken."""
        node, m = h
        if m < len(node.key):
            return [(node.key[m], 1.0, (node, m + 1))]
        return [
            (c.key[0], float(max(c.insert_count, 1)), (c, 1))
            for c in self.tree.branches(node, namespace)
        ]

    def release(self, req: DraftReq) -> None:
        if self.lookup is not None:
            self.lookup.forget(req.rid)
        # Learn from answers that ended at a stop or the length limit. An aborted one is cut
        # wherever the client left or an error struck, and often is the text nobody wanted (a
        # runaway repetition cancelled): not worth proposing to others.
        reason = req.finished_reason
        if (
            self.suffix is None
            or not req.output_ids
            or reason is None
            or isinstance(reason, FinishAbort)
        ):
            return
        # The prompt's last tokens come along: they are the context the answer's start follows.
        self.suffix.add(req.origin_input_ids[-self.suffix.max_match :] + req.output_ids)
