"""DraftSource: what proposes draft tokens for a running request.

A source sees the request (its tokens, prompt + output, and where it sits in the radix tree) and
returns up to `k` token ids it expects the model to produce next. Proposals cost no forward of
the target model; a wrong one costs only the verify step's extra query rows, and the verifier
keeps the output distribution exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixlm.cache.radix_cache import RadixCache
    from radixlm.scheduler.req import Req

SPECULATIVE_ALGORITHMS = ("ngram", "radix")


class DraftSource(Protocol):
    def propose(self, req: "Req", k: int) -> list[int]:
        """Up to k draft tokens to follow req's tokens (prompt + output so far)."""
        ...

    def release(self, rid: str) -> None:
        """The request left: drop whatever per-request state the source keeps."""
        ...


def create_draft_source(algorithm: str, server_args, tree_cache: "RadixCache") -> DraftSource:
    if algorithm == "ngram":
        from radixlm.speculative.ngram import NgramDraftSource

        return NgramDraftSource(server_args.speculative_ngram_min_match_window_size,
                                server_args.speculative_ngram_max_match_window_size)
    if algorithm == "radix":
        from radixlm.speculative.radix import RadixDraftSource

        return RadixDraftSource(tree_cache)
    raise ValueError(f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS}, got {algorithm!r}")
