"""Prefill folding: a request that needs one prompt token computed joins the decode step instead.

A prompt the radix cache holds but for its last token (an agent's repeated call, a retried
prompt) needs a prefill step of one row, then decode or verify steps. With speculative decoding
that row can be the root of the request's first verify step: admitted, the request goes straight
to RUNNING with its last prompt token uncomputed, the decode step feeds that token as its next
input (ScheduleBatch._next_input) and the draft source proposes what follows the whole prompt. A
recorded answer then comes back in the same forward that computes the prompt's last KV: one step
fewer per repeated call, and that step was a whole forward of fixed cost for one row.

What the prefill step does for a request's first token the decode step does too (sampling,
output logprobs, stops, jump-forward, streaming); a request it cannot stand in for is not folded:
prompt logprobs (they need the extend's rows), images (their embeddings come with an extend), a
request for no new token (an embedding model's too), one between its chunks. Only where the draft
source reads tokens alone (radix, ngram, a draft model): EAGLE's head needs the target's features
of the prompt's last token.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from radixlm.scheduler.batch import PrefillChunk
from radixlm.scheduler.req import Req, ReqStatus


class BasePrefillFold(ABC):
    """Admission's choice for each admitted chunk: NoPrefillFold or PrefillFold."""

    @abstractmethod
    def split(self, chunks: list[PrefillChunk]) -> tuple[list[PrefillChunk], list[Req]]:
        """The chunks the extend step computes, and the requests that join the decode step
        instead."""


class NoPrefillFold(BasePrefillFold):
    def split(self, chunks: list[PrefillChunk]) -> tuple[list[PrefillChunk], list[Req]]:
        return chunks, []


class PrefillFold(BasePrefillFold):
    def split(self, chunks: list[PrefillChunk]) -> tuple[list[PrefillChunk], list[Req]]:
        keep, fold = [], []
        for c in chunks:
            if self.foldable(c):
                fold.append(c.req)
            else:
                keep.append(c)
        return keep, fold

    @staticmethod
    def foldable(chunk: PrefillChunk) -> bool:
        r = chunk.req
        return (
            chunk.length == 1
            and chunk.is_last
            and chunk.logprob_start is None
            and r.status is ReqStatus.WAITING
            and r.mm_inputs is None
            and r.sampling_params.max_new_tokens > 0
        )
