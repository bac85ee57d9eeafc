"""DraftSource: what proposes draft tokens for a running request.

A source sees the request (its tokens, prompt + output, and where it sits in the radix tree) and
returns up to `k` token ids it expects the model to produce next. Proposals cost no forward of
the target model; a wrong one costs only the verify step's extra query rows, and the verifier
keeps the output distribution exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:
    from radixlm.cache.radix_cache import RadixCache
    from radixlm.scheduler.req import Req

SPECULATIVE_ALGORITHMS = ("ngram", "radix", "draft-model")


class DraftSource(Protocol):
    # True where proposing costs no forward (a lookup): the controller then also drafts for
    # requests it does not verify this step, to learn their acceptance rates for free.
    cheap: bool

    def propose(self, reqs: list["Req"], ks: list[int]) -> list[list[int]]:
        """Per request, up to ks[i] draft tokens to follow its tokens (prompt + output so far);
        ks[i] == 0: none. One call per step, so a source that runs a model batches it."""
        ...

    def release(self, req: "Req") -> None:
        """The request finished or left: drop (or learn from) what the source keeps for it."""
        ...


class PerRequestDraftSource:
    """A source whose drafts come one request at a time (lookups, no forward)."""

    cheap = True  # drafting costs next to nothing: the controller may draft to learn rates

    def propose(self, reqs: list["Req"], ks: list[int]) -> list[list[int]]:
        return [self.draft_for(r, k) if k > 0 else [] for r, k in zip(reqs, ks)]

    def draft_for(self, req: "Req", k: int) -> list[int]:
        raise NotImplementedError

    def release(self, req: "Req") -> None:
        pass


def create_draft_source(algorithm: str, server_args, tree_cache: "RadixCache", kv_pool_size: int,
                        target_vocab_size: Optional[int] = None) -> DraftSource:
    """target_vocab_size: the target model's (a draft model must match it; None: read from its config)."""
    if algorithm == "ngram":
        from radixlm.speculative.ngram import NgramDraftSource

        return NgramDraftSource(server_args.speculative_ngram_min_match_window_size,
                                server_args.speculative_ngram_max_match_window_size)
    if algorithm == "radix":
        from radixlm.speculative.radix import RadixDraftSource

        suffix_index = None
        if server_args.speculative_suffix_index_tokens > 0:
            from radixlm.speculative.suffix_index import SuffixIndex

            suffix_index = SuffixIndex(server_args.speculative_suffix_index_tokens,
                                       server_args.speculative_ngram_min_match_window_size,
                                       server_args.speculative_ngram_max_match_window_size)
        from radixlm.speculative.ngram import NgramDraftSource

        lookup = NgramDraftSource(server_args.speculative_ngram_min_match_window_size,
                                  server_args.speculative_ngram_max_match_window_size)
        return RadixDraftSource(tree_cache, suffix_index, lookup)
    if algorithm == "draft-model":
        from radixlm.speculative.draft_model import DraftModelSource

        # The draft pool defaults to the target's KV capacity: the running requests never hold more.
        return DraftModelSource(server_args, default_kv_tokens=kv_pool_size,
                                target_vocab_size=target_vocab_size)
    raise ValueError(f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS}, got {algorithm!r}")
