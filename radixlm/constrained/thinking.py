"""ThinkingGrammar: a reasoning request's think block, as a grammar object around its constraint.

A request that thinks (SGLang's require_reasoning, or a thinking budget) starts inside the think
block; the block ends when its output holds the format's end marker ("</think>", one or several
tokens of the served tokenizer). While the block is open nothing is masked, except that once the
request has generated `budget` thinking tokens (an opening marker at the very start not counted)
the end marker's tokens are forced, one per step. After the end marker the request's own grammar
(json_schema, regex, ebnf, structural_tag), if any, starts at the next token: the grammar applies
to the answer only (SGLang's ReasonerGrammarObject; a budget is its strict thinking).

Being a grammar object is what makes every consumer right without asking: the mask of a step, a
draft's cut and rows under speculative decoding (accept / rollback), jump-forward (nothing forced
while thinking), overlap scheduling (constrained requests never overlap).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from radixlm.constrained.base_grammar_backend import BaseGrammarObject


@dataclass(frozen=True)
class ThinkMarkers:
    """The reasoning format's markers as token ids of the served tokenizer."""

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]


class Phase(Enum):
    THINK = "think"  # inside the block, free
    FORCE = "force"  # the budget is spent: the end marker's tokens, one by one
    ANSWER = "answer"  # after the end marker: the inner grammar, if any


@dataclass(frozen=True)
class _State:
    phase: Phase
    forced: int  # FORCE: end-marker tokens emitted so far
    think_len: int  # tokens inside the block so far
    inner_accepted: bool  # the token that left this state went to the inner grammar (rollback)


class ThinkingGrammar(BaseGrammarObject):
    def __init__(self, markers: ThinkMarkers, budget: int | None, inner: BaseGrammarObject | None):
        self.markers = markers
        self.budget = budget
        self.inner = inner
        self.phase, self.forced = Phase.THINK, 0
        self.think: list[int] = []  # the block's tokens (natural end and counting)
        self.history: list[_State] = []  # one per accepted token: the state before it
        self._check_budget()

    # --- state ---------------------------------------------------------------------
    def thinking_tokens(self) -> int:
        start = self.markers.start_ids
        lead = len(start) if start and tuple(self.think[: len(start)]) == start else 0
        return len(self.think) - lead

    def _check_budget(self) -> None:
        if (
            self.phase is Phase.THINK
            and self.budget is not None
            and self.thinking_tokens() >= self.budget
        ):
            self.phase, self.forced = Phase.FORCE, 0

    def accept_token(self, token_id: int) -> bool:
        before = _State(self.phase, self.forced, len(self.think), False)
        if self.phase is Phase.ANSWER:
            if self.inner is not None and not self.inner.accept_token(token_id):
                return False
            before = _State(Phase.ANSWER, 0, len(self.think), self.inner is not None)
        elif self.phase is Phase.FORCE:
            end = self.markers.end_ids
            if token_id != end[self.forced]:
                return False
            self.forced += 1
            if self.forced == len(end):
                self.phase = Phase.ANSWER
        else:
            self.think.append(token_id)
            end = self.markers.end_ids
            if len(self.think) >= len(end) and tuple(self.think[-len(end) :]) == end:
                self.phase = Phase.ANSWER  # the model closed the block itself
            else:
                self._check_budget()
        self.history.append(before)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        undone = self.history[-num_tokens:]
        del self.history[-num_tokens:]
        inner = sum(s.inner_accepted for s in undone)
        if inner:
            self.inner.rollback(inner)
        first = undone[0]
        self.phase, self.forced = first.phase, first.forced
        del self.think[first.think_len :]

    def is_completed(self) -> bool:
        if self.phase is not Phase.ANSWER:
            return False
        return self.inner is None or self.inner.is_completed()

    def is_terminated(self) -> bool:
        return self.phase is Phase.ANSWER and self.inner is not None and self.inner.is_terminated()

    # --- masks -----------------------------------------------------------------------
    def backend_grammar(self) -> BaseGrammarObject | None:
        """The grammar whose mask the backend fills now (batched with the other requests'): the
        inner one in the answer; None while this object fills its own row (or leaves it free)."""
        return self.inner if self.phase is Phase.ANSWER else None

    def masks(self) -> bool:
        """Whether this step's row is constrained at all."""
        return self.phase is Phase.FORCE or (self.phase is Phase.ANSWER and self.inner is not None)

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        if self.phase is Phase.FORCE:
            t = self.markers.end_ids[self.forced]
            vocab_mask[idx].zero_()
            vocab_mask[idx, t // 32] = -(1 << 31) if t % 32 == 31 else 1 << (t % 32)
        elif self.phase is Phase.ANSWER and self.inner is not None:
            self.inner.fill_vocab_mask(vocab_mask, idx)

    def find_jump_forward_str(self) -> str:
        # The forced end marker is decoded token by token: re-tokenizing it could change its ids.
        return (
            self.inner.find_jump_forward_str()
            if self.phase is Phase.ANSWER and self.inner is not None
            else ""
        )

    # --- copies ----------------------------------------------------------------------
    def copy(self) -> ThinkingGrammar:
        return ThinkingGrammar(
            self.markers, self.budget, None if self.inner is None else self.inner.copy()
        )

    def fork(self) -> ThinkingGrammar:
        g = ThinkingGrammar(
            self.markers, self.budget, None if self.inner is None else self.inner.fork()
        )
        g.phase, g.forced, g.think, g.history = (
            self.phase,
            self.forced,
            list(self.think),
            list(self.history),
        )
        return g
