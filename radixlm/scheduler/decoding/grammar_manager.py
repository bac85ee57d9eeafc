"""GrammarManager: structured output for the scheduler.

A constrained request's grammar compiles on the backend's thread pool while the request waits
(GRAMMAR_PENDING); each step masks the logits of constrained rows; a verify step masks each draft
row with the matcher's state at that position (speculative/grammar.py). The backend
(constrained/) is created at the first constrained request.
"""

from __future__ import annotations

import time

import torch

from radixlm.constrained import InvalidGrammar, create_grammar_backend
from radixlm.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
from radixlm.constrained.thinking import ThinkingGrammar
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.req import Req
from radixlm.scheduler.stats import SchedulerStats
from radixlm.speculative.draft_tree import DraftTree
from radixlm.speculative.grammar import masked_tree_rows


class GrammarManager:
    def __init__(
        self,
        backend_name: str,
        tokenizer: LazyTokenizer,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        stats: SchedulerStats,
    ):
        self.backend_name = backend_name
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.stats = stats
        self._backend: BaseGrammarBackend | None = None

    @property
    def backend(self) -> BaseGrammarBackend:
        if self._backend is None:
            backend = create_grammar_backend(
                self.backend_name,
                self.tokenizer.get(),
                self.vocab_size,
                eos_token_ids=sorted(self.eos_token_ids),
            )
            if backend is None:
                raise ValueError("the server runs with --grammar-backend none")
            self._backend = backend
        return self._backend

    # --- compile ------------------------------------------------------------------
    def start(self, req: Req) -> str | None:
        """Start compiling req's grammar (req.grammar becomes its future); the error message when
        structured output is unavailable."""
        try:
            req.grammar = self.backend.get_future(req.sampling_params.grammar_key)
        except Exception as e:
            return f"structured output unavailable: {e}"
        return None

    @staticmethod
    def compiled(req: Req) -> bool:
        return req.grammar.done()

    def resolve(self, req: Req) -> str | None:
        """Swap req's finished compile for its matcher; the 400 message when the grammar is
        invalid."""
        try:
            grammar = req.grammar.result()
        except Exception as e:
            grammar = InvalidGrammar(req.sampling_params.grammar_key, f"{type(e).__name__}: {e}")
        if isinstance(grammar, InvalidGrammar):
            kind = {"json": "json_schema"}.get(grammar.key[0], grammar.key[0])
            return f"invalid sampling_params.{kind}: {grammar.message}"
        req.grammar = self.with_thinking(req, grammar)
        return None

    @staticmethod
    def with_thinking(req: Req, inner: BaseGrammarObject | None) -> BaseGrammarObject | None:
        """A request that thinks gets its think block (and budget) around its grammar, which then
        applies to the answer only (constrained/thinking.py); others keep theirs (or none)."""
        sp = req.sampling_params
        if sp.think_markers is None:
            return inner
        return ThinkingGrammar(sp.think_markers, sp.max_thinking_tokens, inner)

    # --- masks (on the thread that runs the forward) --------------------------------
    def mask(
        self, batch: ScheduleBatch, logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[int, str]]:
        """Logits with each constrained row's disallowed tokens at -inf (a copy: logprobs are
        reported from the model's own distribution), and the rows whose mask failed. A middle
        chunk's row is left alone: its sample is dropped and its grammar has not started."""
        reqs = batch.reqs
        rows = [
            i
            for i, (r, keep) in enumerate(zip(reqs, batch.sampling_rows()))
            if keep and r.grammar is not None and r.grammar.masks()
        ]
        if not rows:
            return logits, {}
        t0 = time.perf_counter()
        # The backend's grammars fill their rows in one batch; a think block fills its own (the
        # forced end marker), without a backend: a budget alone needs no grammar engine.
        inner = {i: reqs[i].grammar.backend_grammar() for i in rows}
        own = [i for i in rows if inner[i] is None]
        rows = [i for i in rows if inner[i] is not None]
        backend, errors = self.backend if rows else BaseGrammarBackend, {}
        mask = backend.allocate_vocab_mask(
            self.vocab_size, len(reqs), logits.device
        )  # pinned for a GPU
        for i in own:
            reqs[i].grammar.fill_vocab_mask(mask, i)
        try:
            if rows:
                backend.fill_vocab_masks([inner[i] for i in rows], mask, rows)
        except Exception:
            for i in rows:
                try:
                    backend.fill_vocab_masks([inner[i]], mask, [i])
                except Exception as e:
                    errors[i] = f"internal error: grammar mask: {type(e).__name__}: {e}"
        logits = logits.clone()
        backend.apply_vocab_mask(logits, backend.move_vocab_mask(mask, logits.device))
        self.stats.grammar_mask_seconds += time.perf_counter() - t0
        self.stats.grammar_mask_steps += 1
        return logits, errors

    def masked_tree_rows(self, req: Req, tree: DraftTree, rows: torch.Tensor) -> torch.Tensor:
        # Only the mask layout's static helpers are used: a think block needs no grammar engine.
        return masked_tree_rows(self._backend or BaseGrammarBackend, req.grammar, tree, rows)
