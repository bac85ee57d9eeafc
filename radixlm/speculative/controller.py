"""SpecController: which running requests draft how many tokens this step, and the counters.

A request drafts when the verifier can keep its output exact and cheap: no grammar (its matcher
would have to follow the drafts), no penalties and no pending min_new_tokens ban (they change
with every accepted token). Its draft length follows its recent acceptance: an exponential
average of accepted / drafted, scaled to the configured maximum, so text where drafts keep
failing drafts fewer tokens, then none for a while.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.speculative.draft_source import DraftSource

if TYPE_CHECKING:
    from radixlm.scheduler.req import Req

ACCEPT_EMA = 0.5  # weight of the newest verify step in a request's acceptance average
RECOVER = 0.01  # added to the average per step a request skips drafting (a probe every ~10 steps)


@dataclass
class SpecStats:
    verify_steps: int = 0  # forwards that verified at least one draft
    draft_tokens: int = 0  # draft tokens sent to verification
    accepted_tokens: int = 0  # of them, accepted
    drafted_requests: int = 0  # request-steps that carried a draft

    @property
    def accept_length(self) -> float:
        """Tokens emitted per drafted request per verify step (accepted drafts + the model's own)."""
        return (self.accepted_tokens + self.drafted_requests) / self.drafted_requests if self.drafted_requests else 0.0

    def as_dict(self) -> dict:
        return {"spec_verify_steps": self.verify_steps, "spec_draft_tokens": self.draft_tokens,
                "spec_accepted_tokens": self.accepted_tokens, "spec_accept_length": round(self.accept_length, 3)}


class SpecController:
    def __init__(self, source: DraftSource, num_draft_tokens: int):
        if num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.source = source
        self.max_draft = num_draft_tokens
        self.stats = SpecStats()
        self._accept: dict[str, float] = {}  # rid -> recent accepted / drafted

    @staticmethod
    def can_draft(req: "Req") -> bool:
        sp = req.sampling_params
        return (req.grammar is None and not sp.frequency_penalty and not sp.presence_penalty
                and sp.repetition_penalty == 1.0 and len(req.output_ids) >= sp.min_new_tokens)

    def propose(self, reqs: list["Req"], spare_slots: int, context_len: int) -> list[list[int]]:
        """Per request, the draft to verify with its next token (maybe empty). Uses at most
        spare_slots KV slots beyond one per request."""
        drafts: list[list[int]] = []
        for req in reqs:
            k = 0
            if self.can_draft(req):
                left = req.sampling_params.max_new_tokens - len(req.output_ids) - 1  # room for the bonus token
                k = min(self._draft_len(req.rid), left, context_len - req.seqlen - 1, spare_slots)
            draft = self.source.propose(req, k) if k > 0 else []
            spare_slots -= len(draft)
            drafts.append(draft)
        return drafts

    def _draft_len(self, rid: str) -> int:
        """max_draft scaled by the recent acceptance; 0 (no draft) once drafts keep failing, and
        the average creeps back up while the request does not draft, so it probes again later."""
        rate = self._accept.get(rid, 1.0)
        k = int(self.max_draft * rate + 0.5)
        if k == 0:
            self._accept[rid] = rate + RECOVER
        return k

    def on_verified(self, req: "Req", drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.stats.draft_tokens += drafted
        self.stats.accepted_tokens += accepted
        self.stats.drafted_requests += 1
        old = self._accept.get(req.rid, 1.0)
        self._accept[req.rid] = (1 - ACCEPT_EMA) * old + ACCEPT_EMA * accepted / drafted

    def release(self, req: "Req") -> None:
        self._accept.pop(req.rid, None)
        self.source.release(req.rid)
