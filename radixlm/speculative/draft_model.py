"""Drafts from a smaller model: greedy decoding of a draft model with the target's vocabulary
(SGLang's STANDALONE speculative algorithm; `--speculative-algorithm draft-model`).

The draft model runs in its own ModelRunner: its own weights and its own ReqToTokenPool and
TokenToKVPool, never the target's (the target's radix tree, admission and invariants know nothing
of it). Per request the source keeps a row of the draft pool and the token ids whose K/V that row
holds. At each step, for the requests the controller asks to draft:

  1. catch up: the row's ids are compared with the request's (prompt + output so far); the K/V
     past their common prefix is freed (drafts the target rejected, a jump-forward's rewrite) and
     the missing tokens run through batched extend forwards (at most max_prefill_tokens tokens
     each); the logits after the request's last token give draft token 1;
  2. k - 1 batched decode forwards, argmax each, requests dropping out as they reach their k.

The drafts' own K/V stays in the row: at the next step the common prefix keeps exactly what the
target accepted. Short of slots or rows, requests that are not running (retracted) lose their
rows first; a request that still finds no room drafts fewer tokens, or none, this step.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.errors import InvariantError
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.forward_batch import ForwardMode
from radixlm.speculative.draft_source import DraftReq, DraftSourceBase
from radixlm.speculative.draft_tree import CHAIN, TreeShape
from radixlm.utils import common_prefix_len

if TYPE_CHECKING:
    from radixlm.speculative.config import SpeculativeConfig

logger = logging.getLogger(__name__)


def draft_runner_config(
    target: ModelRunnerConfig, draft_model_path: str, kv_tokens: int
) -> ModelRunnerConfig:
    """The draft model's ModelRunner options: the target's (device, dtype, attention, threads, seed)
    for another model in its own pool."""
    return dataclasses.replace(
        target,
        model_path=draft_model_path,
        # "gguf" names a GGUF's own formats; a draft from a HF directory runs in float then.
        quantization=None if target.quantization == "gguf" else target.quantization,
        max_total_tokens=kv_tokens,
        # The decode KV mirror trusts a row's KV below its length never to change; the draft
        # rewrites positions (rejected drafts are recomputed as the target's tokens).
        decode_kv_mirror_bytes=0,
        model_overrides={},  # --json-model-override-args names the target's config, not the draft's
        spec_draft_tokens=0,
    )


@dataclass(eq=False)
class _DraftReq:
    req: DraftReq
    row: int  # the request's row of the draft ReqToTokenPool
    ids: list[int] = field(
        default_factory=list
    )  # tokens whose K/V the row holds, positions 0..len - 1
    # Slots this request owns: req_to_token[row, :slots]. Equals len(ids) between steps; during a
    # step it includes the slots allocated for the tokens about to be computed.
    slots: int = 0


@dataclass(eq=False)
class _Work:
    st: _DraftReq
    tokens: list[int]  # the request's tokens (prompt + output)
    pos: int  # catch-up progress: K/V of tokens[:pos] is in the row
    k: int  # draft tokens to produce
    draft: list[int] = field(default_factory=list)


class DraftModelSource(DraftSourceBase):
    def __init__(
        self,
        config: SpeculativeConfig,
        target: ModelRunnerConfig,
        kv_tokens: int,
        target_vocab_size: int,
    ):
        from radixlm.model.executor.runner import ModelRunner

        self.runner = ModelRunner(draft_runner_config(target, config.draft_model_path, kv_tokens))
        if self.runner.state_pool is not None:  # its rows roll back by truncating their KV
            raise ValueError(
                f"speculative_draft_model_path {config.draft_model_path!r}: a hybrid model"
                " (recurrent state layers) cannot draft: a rejected draft would stay in its state"
            )
        if self.runner.vocab_size != target_vocab_size:
            raise ValueError(
                f"speculative_draft_model_path {config.draft_model_path!r}: vocab size"
                f" {self.runner.vocab_size} differs from the target's {target_vocab_size} (the"
                " draft model must share the target's tokenizer)"
            )
        self.req_to_token_pool = self.runner.req_to_token_pool
        self.kv_pool = self.runner.token_to_kv_pool
        self.context_len = self.runner.context_len
        self.max_extend_tokens = max(1, config.max_extend_tokens)
        self.check_invariants = config.check_invariants
        self._reqs: dict[str, _DraftReq] = {}  # rid -> its draft row
        logger.info(
            "draft model %s: %s, vocab %d, KV pool %d tokens",
            self.runner.loaded.model_path,
            self.runner.loaded.architecture,
            self.runner.vocab_size,
            self.kv_pool.size,
        )

    # ------------------------------------------------------------------ DraftSource
    def propose(
        self, reqs: list[DraftReq], ks: list[int], shape: TreeShape = CHAIN
    ) -> list[list[int]]:
        """Chains: greedy decoding gives one candidate per step (shape is the controller's to
        cut)."""
        running = {id(r) for r in reqs}
        # A request that finished without a release (aborted while retracted) never comes back.
        for st in [s for s in self._reqs.values() if s.req.finished() and id(s.req) not in running]:
            self._drop(st)
        out: list[list[int]] = [[] for _ in reqs]
        work: list[tuple[int, _Work]] = []
        for i, (req, k) in enumerate(zip(reqs, ks)):
            w = self._plan(req, k, running) if k > 0 else None
            if w is not None:
                work.append((i, w))
        if work:
            try:
                self._run_drafts([w for _, w in work])
            except Exception:
                if self.check_invariants:
                    raise
                # Drafts only buy speed: the target decodes on without them; the rows start over.
                logger.exception("draft model forward failed: no drafts this step")
                for _, w in work:
                    self._drop(w.st)
                self.runner.reset_attention_state()
                return out
            for i, w in work:
                out[i] = w.draft
        if self.check_invariants:
            self.check()
        return out

    def release(self, req: DraftReq) -> None:
        st = self._reqs.get(req.rid)
        if st is not None and st.req is req:
            self._drop(st)

    # ------------------------------------------------------------------ planning
    def _plan(self, req: DraftReq, k: int, running: set[int]) -> _Work | None:
        """Free the row's K/V past what still matches req's tokens and allocate slots for the
        missing tokens and k - 1 drafts (the last draft needs logits, no K/V)."""
        tokens = req.all_ids()
        n = len(tokens)
        st = self._reqs.get(req.rid)
        if st is not None and st.req is not req:  # a new request reusing a finished one's rid
            self._drop(st)
            st = None
        k = min(k, self.context_len - n + 1)  # K/V up to position n + k - 2
        if k < 1:
            if st is not None:  # the context only grows: this request never drafts again
                self._drop(st)
            return None
        if st is None:
            row = self.req_to_token_pool.alloc()
            if row is None and self._evict_idle(running):
                row = self.req_to_token_pool.alloc()
            if row is None:
                return None
            st = self._reqs[req.rid] = _DraftReq(req, row)
        # At least the last token runs: its logits give draft token 1.
        keep = min(common_prefix_len(st.ids, tokens), n - 1)
        self._truncate(st, keep)
        missing = n - keep
        if self.kv_pool.available_size() < missing + k - 1:
            self._evict_idle(running)
        k = min(k, self.kv_pool.available_size() - missing + 1)
        if k < 1:
            return None  # the row keeps its K/V for a later step
        slots = self.kv_pool.alloc(missing + k - 1)
        r2t = self.req_to_token_pool.req_to_token
        r2t[st.row, keep : n + k - 1] = slots.to(r2t.device)
        st.slots = n + k - 1
        return _Work(st, tokens, keep, k)

    def _truncate(self, st: _DraftReq, length: int) -> None:
        if st.slots > length:
            self.kv_pool.free(self.req_to_token_pool.req_to_token[st.row, length : st.slots])
            st.slots = length
        del st.ids[length:]

    def _drop(self, st: _DraftReq) -> None:
        self._truncate(st, 0)
        self.req_to_token_pool.free(st.row)
        del self._reqs[st.req.rid]

    def _evict_idle(self, running: set[int]) -> bool:
        """Drop the rows of requests not running this step (retracted ones re-prefill later)."""
        idle = [st for st in self._reqs.values() if id(st.req) not in running]
        for st in idle:
            self._drop(st)
        return bool(idle)

    # ------------------------------------------------------------------ forwards
    def _run_drafts(self, work: list[_Work]) -> None:
        # Catch up in extend forwards of at most max_extend_tokens tokens (a new request's prompt
        # may be long); a request's chunks go in order, one per forward.
        pending = list(work)
        while pending:
            budget, batch = self.max_extend_tokens, []
            for w in pending:
                if budget == 0:
                    break
                end = min(len(w.tokens), w.pos + budget)
                batch.append((w, w.pos, end))
                budget -= end - w.pos
            r2t = self.req_to_token_pool.req_to_token
            ids = self._forward(
                ForwardMode.EXTEND,
                input_ids=[t for w, s, e in batch for t in w.tokens[s:e]],
                positions=[p for _, s, e in batch for p in range(s, e)],
                rows=[w.st.row for w, _, _ in batch],
                seq_lens=[e for _, _, e in batch],
                out_loc=torch.cat([r2t[w.st.row, s:e] for w, s, e in batch]),
                prefix_lens=[s for _, s, _ in batch],
                ext_lens=[e - s for _, s, e in batch],
            )
            for (w, _, end), tok in zip(batch, ids):
                w.pos = end
                if end == len(w.tokens):
                    w.draft.append(tok)
            pending = [w for w in pending if w.pos < len(w.tokens)]
        # Decode: step j feeds draft token j at position n + j - 1.
        for j in range(1, max(w.k for w in work)):
            active = [w for w in work if w.k > j]
            pos = [len(w.tokens) + j - 1 for w in active]
            rows = [w.st.row for w in active]
            r2t = self.req_to_token_pool.req_to_token
            loc = r2t[torch.tensor(rows, device=r2t.device), torch.tensor(pos, device=r2t.device)]
            ids = self._forward(
                ForwardMode.DECODE,
                input_ids=[w.draft[j - 1] for w in active],
                positions=pos,
                rows=rows,
                seq_lens=[p + 1 for p in pos],
                out_loc=loc,
            )
            for w, tok in zip(active, ids):
                w.draft.append(tok)
        for w in work:
            w.st.ids = w.tokens + w.draft[: w.k - 1]
            assert len(w.st.ids) == w.st.slots, (w.st.req.rid, len(w.st.ids), w.st.slots)

    def _forward(
        self,
        mode: ForwardMode,
        input_ids,
        positions,
        rows,
        seq_lens,
        out_loc,
        prefix_lens=None,
        ext_lens=None,
    ) -> list[int]:
        """One forward of the draft model; the argmax token after each request's last new token."""
        fb = self.runner.prepare(
            ModelWorkerBatch(
                mode,
                input_ids,
                positions,
                rows,
                seq_lens,
                out_loc,
                extend_prefix_lens=prefix_lens,
                extend_seq_lens=ext_lens,
            )
        )
        logits = self.runner.forward(fb).next_token_logits
        return torch.argmax(logits, dim=-1).tolist()

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Every draft KV slot is free or in exactly one request's row, every row free or held
        once, and each row's ids cover exactly its slots (enable_invariant_checks)."""

        r2t, states = self.req_to_token_pool.req_to_token, list(self._reqs.values())
        owned = torch.cat(
            [self.kv_pool.free_slots.cpu()] + [r2t[st.row, : st.slots].cpu() for st in states]
        )
        if not torch.equal(owned.sort().values, torch.arange(1, self.kv_pool.size + 1)):
            raise InvariantError(
                f"draft KV pool: {owned.numel()} owned slots for {self.kv_pool.size}, "
                f"{owned.numel() - owned.unique().numel()} duplicated"
            )
        rows = sorted(self.req_to_token_pool.free_slots + [st.row for st in states])
        if rows != list(range(self.req_to_token_pool.size)):
            raise InvariantError("draft request rows: some row is lost or held twice")
        for st in states:
            if len(st.ids) != st.slots:
                raise InvariantError(
                    f"draft row of {st.req.rid}: {len(st.ids)} ids for {st.slots} slots"
                )
