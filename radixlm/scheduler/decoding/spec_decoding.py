"""Speculative decoding as a scheduler component (the drafting itself lives in
radixlm/speculative/).

BaseSpeculation is what the scheduler asks of it. NoSpeculation is the component of a server
without --speculative-algorithm: every decode step is a plain one. SpecDecoding asks the controller
for drafts, turns the step into TARGET_VERIFY when any request drafts, verifies each draft on the
worker thread, and keeps the controller's books.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from radixlm.model.forward_batch import ForwardMode
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.decoding.grammar_manager import GrammarManager
from radixlm.scheduler.decoding.prefill_fold import BasePrefillFold, NoPrefillFold, PrefillFold
from radixlm.scheduler.req import Req
from radixlm.speculative.controller import SpecController
from radixlm.speculative.draft_tree import DraftTree
from radixlm.speculative.verify import Acceptance, accept_tree


def plain_decode_batch(running: list[Req]) -> ScheduleBatch:
    """A decode step of every running request, one token each (no drafts)."""
    return ScheduleBatch(ForwardMode.DECODE, decode_reqs=list(running))


class BaseSpeculation(ABC):
    """Speculative decoding as the scheduler's components see it: NoSpeculation or SpecDecoding."""

    @abstractmethod
    def decode_batch(self, running: list[Req], spare_slots: int, context_len: int) -> ScheduleBatch:
        """The next decode step of `running`: plain, or TARGET_VERIFY with per-request drafts."""

    @abstractmethod
    def verify(
        self,
        batch: ScheduleBatch,
        row_logits: list[torch.Tensor],
        next_ids: list[int],
        errors: dict[int, str],
    ) -> list[Acceptance]:
        """A verify step's outcome per request (on the executor's thread)."""

    @abstractmethod
    def prefill_fold(self) -> BasePrefillFold:
        """What admission does with a request that has one prompt token left to compute."""

    @abstractmethod
    def on_step(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` query rows ran in `seconds` (the cost model learns from it)."""

    @abstractmethod
    def on_verify_step(self, rows: int, seconds: float) -> None:
        """A verify step of `rows` query rows ran in `seconds`."""

    @abstractmethod
    def on_verified(
        self, req: Req, tree: DraftTree, path: list[int], kept: int, rows: list[int]
    ) -> None:
        """What req's verify step accepted of its draft tree."""

    @abstractmethod
    def release(self, req: Req) -> None:
        """req finished: forget what was kept for it."""

    @abstractmethod
    def info(self) -> dict:
        """For /get_server_info's internal_state."""

    @abstractmethod
    def log_suffix(self) -> str:
        """Appended to the decode log line."""


class NoSpeculation(BaseSpeculation):
    def decode_batch(self, running: list[Req], spare_slots: int, context_len: int) -> ScheduleBatch:
        return plain_decode_batch(running)

    def verify(
        self,
        batch: ScheduleBatch,
        row_logits: list[torch.Tensor],
        next_ids: list[int],
        errors: dict[int, str],
    ) -> list[Acceptance]:
        raise AssertionError("no verify step without speculative decoding")

    def prefill_fold(self) -> BasePrefillFold:
        return NoPrefillFold()

    def on_step(self, rows: int, seconds: float) -> None:
        pass

    def on_verify_step(self, rows: int, seconds: float) -> None:
        pass

    def on_verified(
        self, req: Req, tree: DraftTree, path: list[int], kept: int, rows: list[int]
    ) -> None:
        pass

    def release(self, req: Req) -> None:
        pass

    def info(self) -> dict:
        return {}

    def log_suffix(self) -> str:
        return ""


class SpecDecoding(BaseSpeculation):
    def __init__(
        self,
        controller: SpecController,
        grammar: GrammarManager,
        state_room: Callable[[], int] | None = None,
    ):
        self.controller = controller
        self.grammar = grammar
        # A hybrid's free draft slots (one per draft node: cache/state_pool.py); None: no state
        # layers.
        self.state_room = state_room

    def decode_batch(self, running: list[Req], spare_slots: int, context_len: int) -> ScheduleBatch:
        if self.state_room is not None:
            spare_slots = min(spare_slots, self.state_room())
        drafts = self.controller.propose(running, spare_slots, context_len)
        if any(drafts):
            return ScheduleBatch(
                ForwardMode.TARGET_VERIFY, decode_reqs=list(running), drafts=drafts
            )
        return plain_decode_batch(running)

    def prefill_fold(self) -> BasePrefillFold:
        # Its first verify step computes the last prompt token's KV with the draft that follows it.
        return PrefillFold() if self.controller.source.drafts_from_tokens else NoPrefillFold()

    def verify(
        self,
        batch: ScheduleBatch,
        row_logits: list[torch.Tensor],
        next_ids: list[int],
        errors: dict[int, str],
    ) -> list[Acceptance]:
        """Per request, what the step emits: its accepted draft nodes' tokens and the model's own
        token (the sampled one where it drafted nothing). A constrained request's rows are masked
        first; a mask that fails fails that request (errors[i]), not the batch."""
        out = []
        for i, (req, draft) in enumerate(zip(batch.decode_reqs, batch.drafts)):
            if not draft:
                out.append(Acceptance([next_ids[i]], []))
                continue
            rows = row_logits[i]
            if req.grammar is not None:
                try:
                    rows = self.grammar.masked_tree_rows(req, draft, rows)
                except Exception as e:
                    errors[i] = f"internal error: grammar mask: {type(e).__name__}: {e}"
                    out.append(Acceptance([], []))
                    continue
            out.append(accept_tree(rows, draft, req.sampling_params, req.generator))
        return out

    def on_step(self, rows: int, seconds: float) -> None:
        self.controller.on_step(rows, seconds)

    def on_verify_step(self, rows: int, seconds: float) -> None:
        self.controller.stats.verify_steps += 1
        self.controller.on_step(rows, seconds)

    def on_verified(
        self, req: Req, tree: DraftTree, path: list[int], kept: int, rows: list[int]
    ) -> None:
        self.controller.on_verified(req, tree, path, kept, rows)

    def release(self, req: Req) -> None:
        self.controller.release(req)

    def info(self) -> dict:
        return self.controller.stats.as_dict()

    def log_suffix(self) -> str:
        # As SGLang's log: tokens per drafted request per verify step, since start.
        return f", accept len {self.controller.stats.accept_length:.2f}"
