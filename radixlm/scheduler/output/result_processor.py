"""ResultProcessor: a step's sampled tokens and logits become request state (tokens, logprobs,
stops, jump-forward), and requests move on: an extend's requests start running, finished ones end.

One request's failure here (a grammar that rejects, a tokenizer error, ...) finishes that request
with an error; the others in the batch go on. A batch whose forward raised fails its requests and
the scheduler goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from radixlm.constrained.base_grammar_backend import BaseGrammarBackend
from radixlm.ipc import FinishLength
from radixlm.model.executor.runner import LogitsOutput, ModelRunner
from radixlm.scheduler.batch import PrefillChunk
from radixlm.scheduler.decoding.spec_decoding import BaseSpeculation
from radixlm.scheduler.execution.executor import BaseExecutor
from radixlm.scheduler.execution.overlap import LaunchedBatch, StepOutput
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.output.finisher import Finisher
from radixlm.scheduler.output.jump_forward import BaseJumpForward
from radixlm.scheduler.output.logprobs import add_input_logprobs, add_output_logprob
from radixlm.scheduler.output.output_streamer import OutputStreamer
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats
from radixlm.speculative.draft_tree import DraftTree
from radixlm.speculative.verify import Acceptance

logger = logging.getLogger(__name__)
S = ReqStatus


class ResultProcessor:
    def __init__(
        self,
        queues: ReqQueues,
        cache_manager: CacheManager,
        finisher: Finisher,
        outputs: OutputStreamer,
        executor: BaseExecutor,
        runner: ModelRunner,
        spec: BaseSpeculation,
        jump_forward: BaseJumpForward,
        tokenizer: LazyTokenizer,
        stats: SchedulerStats,
        log_decode: Callable[[], None],
    ):
        self.queues = queues
        self.cache_manager = cache_manager
        self.finisher = finisher
        self.outputs = outputs
        self.executor = executor
        self.runner = runner
        self.spec = spec
        self.jump_forward = jump_forward
        self.tokenizer = tokenizer
        self.stats = stats
        self.log_decode = log_decode
        self.context_len = runner.context_len

    def process(self, launched: LaunchedBatch) -> None:
        try:
            res: StepOutput = launched.result.result().wait()
        except Exception as e:
            self.fail_batch(launched, e)
            return
        batch, out, ids, errors = launched.batch, res.logits, res.next_ids, res.row_errors
        n, tokens = len(batch.chunks), len(launched.worker_batch.input_ids)
        mode = batch.forward_mode
        if mode.is_verify():
            self.process_decode(
                batch.decode_reqs, out, ids, errors, verified=res.verified, drafts=batch.drafts
            )
            self.stats.on_decode(
                sum(len(a.tokens) for a in res.verified), res.seconds, launched.launch_time
            )
            self.spec.on_verify_step(tokens, res.seconds)
        elif mode.is_mixed():
            # Decode part first: its finished requests leave before the new ones join.
            decode_out = LogitsOutput(next_token_logits=out.next_token_logits[n:])
            decode_err = {i - n: e for i, e in errors.items() if i >= n}
            self.process_decode(batch.decode_reqs, decode_out, ids[n:], decode_err)
            self.process_extend(batch.chunks, out, ids[:n], errors)
            self.stats.on_mixed(tokens - batch.num_decode, batch.num_decode, res.seconds)
        elif mode.is_extend():
            self.process_extend(batch.chunks, out, ids, errors)
            self.stats.on_extend(tokens, res.seconds)
        else:
            self.process_decode(batch.decode_reqs, out, ids, errors, launched.future_slots)
            self.stats.on_decode(len(batch.decode_reqs), res.seconds, launched.launch_time)
            self.spec.on_step(len(batch.decode_reqs), res.seconds)
            self.log_decode()
        self._release_deferred(launched)

    def _release_deferred(self, launched: LaunchedBatch) -> None:
        for req in launched.deferred_release:
            self.finisher.release(req)

    def process_extend(
        self,
        chunks: list[PrefillChunk],
        out: LogitsOutput,
        next_ids: list[int],
        errors: dict[int, str],
    ) -> None:
        for i, chunk in enumerate(chunks):
            req = chunk.req
            try:
                req.kv_committed_len = chunk.end
                req.prefill_chunks += 1
                if out.embeddings is not None:  # an embedding model: fold this chunk's pooled part
                    req.pooled = self.runner.pooler.fold(req.pooled, out.embeddings[i])
                if out.prompt_logprobs is not None and out.prompt_logprobs[i] is not None:
                    add_input_logprobs(req, out.prompt_logprobs[i], chunk)
                if not chunk.is_last:
                    self.cache_manager.cache_req(req, finished=False)
                    continue  # PREFILLING until its next chunk
                if i in errors:
                    req.abort(errors[i], 500)
                elif req.to_abort:
                    req.abort()
                elif req.sampling_params.max_new_tokens == 0:
                    req.finished_reason = FinishLength(0)
                    if req.pooled is not None:
                        req.embedding = self.runner.pooler.finish(req.pooled, req.seqlen)
                else:
                    self.append_token(req, next_ids[i], out.next_token_logits[i])
                if not req.finished() and self.jump_forward.try_jump(req):
                    continue
                if req.finished():
                    self.finisher.finish(req)
                else:
                    self.cache_manager.cache_req(req, finished=False)
                    req.prefill_chunks = 0
                    self.queues.move(req, S.RUNNING)
                    self.outputs.emit(req)
            except Exception as e:
                self.finisher.fail(req, e)

    def process_decode(
        self,
        reqs: list[Req],
        out: LogitsOutput,
        next_ids: list[int],
        errors: dict[int, str],
        slots: list[int] | None = None,
        verified: list[Acceptance] | None = None,
        drafts: list[DraftTree] | None = None,
    ) -> None:
        """A decode step's tokens, or a verify step's (verified[i]: what request i's draft tree
        drafts[i] gave)."""
        was_running = [req.status is S.RUNNING for req in reqs]
        row0 = 0  # a verify step's forward row of request i's root
        for i, req in enumerate(reqs):
            if i and drafts is not None:
                row0 += 1 + len(drafts[i - 1])
            if slots is not None and req.future_slot == slots[i]:
                req.future_slot = None
            if not was_running[i] or req.finished():
                continue  # finished by the step before, while this one was in flight: dropped
            try:
                if i in errors:
                    req.kv_committed_len += 1
                    req.abort(errors[i], 500)
                elif drafts is not None and drafts[i]:
                    self.append_verified(req, drafts[i], verified[i], out.row_logits[i], row0)
                else:
                    req.kv_committed_len += 1
                    self.append_token(req, next_ids[i], out.next_token_logits[i])
                if not req.finished():
                    self.jump_forward.try_jump(req)
            except Exception as e:
                self.finisher.fail(req, e)
        for req, ran in zip(reqs, was_running):
            if req.finished() and req.status is S.RUNNING:
                self.finisher.finish(req)
            elif ran and not req.finished():
                self.outputs.emit(req)  # a request that jumped forward streams its forced text now

    def append_verified(
        self, req: Req, tree: DraftTree, acc: Acceptance, rows: torch.Tensor, row0: int
    ) -> None:
        """A verify step's tokens for req, one by one as decoding would append them (logprobs from
        the row that predicted each, stop checks after each). The step wrote the KV of the next
        input (the root) and of every node of the tree; the accepted path's KV moves to the columns
        right after the root, so each appended token commits one more position, and the KV of the
        other nodes, and of accepted ones after a stop, is freed. row0: the forward's row of the
        root.

        A request that jump-forward may move (constrained, no logprobs) stops taking tokens where
        its grammar forces text: decoding would have jumped there (the caller does), and the
        forced text's canonical tokens can differ from those the model would pick one by one.
        Before that, each token is emitted as decoding emits it, since what was streamed is
        what a jump may not re-tokenize."""
        start, appended, path = req.kv_committed_len, 0, acc.path
        if path != list(range(len(path))):  # a branch, not the first nodes in order: they move up
            on_path = set(path)
            self.cache_manager.reorder_own(
                req, start + 1, path + [j for j in range(len(tree)) if j not in on_path]
            )
        may_jump = self.jump_forward.can_jump(req)
        for j, tok in enumerate(acc.tokens):
            req.kv_committed_len = start + j + 1
            self.append_token(req, tok, rows[0 if j == 0 else 1 + path[j - 1]])
            appended += 1
            if req.finished():
                break
            if may_jump and j < len(acc.tokens) - 1:
                if req.grammar.find_jump_forward_str():
                    break
                self.outputs.emit(req)
        req.spec_verify_ct += 1
        req.spec_accepted_tokens += min(
            len(path), appended
        )  # drafts the model agreed with, before any stop
        kept = min(len(path), appended)
        # A hybrid's state: the root's and the nodes whose tokens were committed after it.
        self.cache_manager.states.on_verified(req, path, min(len(path), max(appended - 1, 0)))
        self.spec.on_verified(req, tree, path, kept, [row0] + [row0 + 1 + n for n in path[:kept]])
        if not req.finished():
            self.cache_manager.free_uncommitted(req)

    def append_token(self, req: Req, tok: int, logits_row: torch.Tensor) -> None:
        req.output_ids.append(tok)
        if req.grammar is not None and not req.grammar.accept_token(tok):
            self.reject_token(req, tok)
        if req.first_token_time is None:
            req.first_token_time = time.time()
        if req.return_logprob:
            add_output_logprob(req, tok, logits_row)
        sp = req.sampling_params
        tokenizer = self.tokenizer.get() if sp.stop_strs or sp.stop_regex else None
        req.check_finished(tokenizer, self.context_len)

    def reject_token(self, req: Req, tok: int) -> None:
        """The grammar refused the sampled token. If it allows no token at all, the request's own
        pattern needs text this vocabulary cannot spell (a regex of a control character the
        tokenizer has no token for, ...): the client's error, named by its field. Otherwise the
        mask and the sampler disagree: ours."""
        mask = BaseGrammarBackend.allocate_vocab_mask(self.runner.vocab_size, 1)
        req.grammar.fill_vocab_mask(mask, 0)
        if not bool(mask.any()):
            kind = req.sampling_params.grammar_key[0]
            field = {"json": "json_schema"}.get(kind, kind)
            done = len(req.output_ids) - 1
            req.abort(
                f"sampling_params.{field}: no token of the model's vocabulary continues the"
                f" constrained output after {done} tokens (it needs text this tokenizer cannot"
                " produce)",
                400,
            )
            return
        logger.error("grammar rejected sampled token %d of request %s", tok, req.rid)
        req.abort("internal error: the grammar rejected a token", 500)

    def fail_batch(self, launched: LaunchedBatch, exc: BaseException) -> None:
        """The forward (or sampling) of a whole batch raised: its requests fail with the error, the
        scheduler goes on. Cross-step attention caches may be half-updated: wait for the worker,
        then drop them."""
        logger.error(
            "a %s step of %d request(s) failed",
            launched.batch.forward_mode.name,
            launched.batch.batch_size(),
            exc_info=exc,
        )
        self.executor.drain()
        self.runner.reset_attention_state()
        for req in launched.batch.reqs:
            if req.finished():
                continue  # finished by an earlier step; released below (or already)
            req.abort(f"internal error: {type(exc).__name__}: {exc}", 500)
            self.finisher.finish(req)
        self._release_deferred(launched)
