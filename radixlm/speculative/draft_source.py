"""DraftSource: what proposes draft tokens for a running request.

A source sees the request (its tokens, prompt + output, and where it sits in the radix tree) and
returns up to `k` token ids it expects the model to produce next. Proposals cost no forward of
the target model; a wrong one costs only the verify step's extra query rows, and the verifier
keeps the output distribution exact.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from radixlm.ipc import FinishReason
from radixlm.sampling_params import SamplingParams


class DraftReq(Protocol):
    """What a draft source may read of a running request (the scheduler's Req has it all)."""

    rid: str
    req_pool_idx: Optional[int]  # its row of the target's ReqToTokenPool (None: not running)
    origin_input_ids: list[int]
    output_ids: list[int]
    sampling_params: SamplingParams
    grammar: Any  # its grammar matcher, or None
    last_node: Any  # the prefix-cache node it holds (None: none)
    cache_protected_len: int  # tokens of its prefix held in the prefix cache
    cache_namespace: Optional[str]
    finished_reason: Optional[FinishReason]

    @property
    def seqlen(self) -> int: ...

    def all_ids(self) -> list[int]: ...

    def finished(self) -> bool: ...


class DraftSource(Protocol):
    # True where proposing costs no forward (a lookup): the controller then also drafts for
    # requests it does not verify this step, to learn their acceptance rates for free.
    cheap: bool

    def propose(self, reqs: list[DraftReq], ks: list[int]) -> list[list[int]]:
        """Per request, up to ks[i] draft tokens to follow its tokens (prompt + output so far);
        ks[i] == 0: none. One call per step, so a source that runs a model batches it."""
        ...

    def release(self, req: DraftReq) -> None:
        """The request finished or left: drop (or learn from) what the source keeps for it."""
        ...


class PerRequestDraftSource:
    """A source whose drafts come one request at a time (lookups, no forward)."""

    cheap = True  # drafting costs next to nothing: the controller may draft to learn rates

    def propose(self, reqs: list[DraftReq], ks: list[int]) -> list[list[int]]:
        return [self.draft_for(r, k) if k > 0 else [] for r, k in zip(reqs, ks)]

    def draft_for(self, req: DraftReq, k: int) -> list[int]:
        raise NotImplementedError

    def release(self, req: DraftReq) -> None:
        pass
