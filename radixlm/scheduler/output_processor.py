"""Result processing: a step's sampled tokens and logits become request state (tokens, logprobs,
stops, jump-forward) and output chunks for the detokenizer.

One request's failure here (a grammar that rejects, a tokenizer error, ...) finishes that request
with an error; the others in the batch go on.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from radixlm.constrained.jump_forward import find_jump_forward
from radixlm.ipc import BatchTokenIDOut, ReqOutputChunk
from radixlm.model.runner import LogitsOutput
from radixlm.scheduler.batch import PrefillChunk
from radixlm.scheduler.overlap import LaunchedBatch, StepOutput
from radixlm.scheduler.req import Req

if TYPE_CHECKING:
    from radixlm.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class SchedulerOutputProcessorMixin:
    def process_result(self: "Scheduler", launched: LaunchedBatch) -> None:
        try:
            res: StepOutput = launched.result.result()
        except Exception as e:  # noqa: BLE001 - the batch fails, the scheduler goes on
            self.handle_forward_failure(launched, e)
            return
        batch, out, ids, errors = launched.batch, res.logits, res.next_ids, res.row_errors
        n = len(batch.chunks)
        if batch.forward_mode.is_verify():
            self.process_decode_result(batch.decode_reqs, out, ids, errors, verified=res.verified, drafts=batch.drafts)
            self.stats.on_decode(sum(map(len, res.verified)), res.seconds, launched.launch_time)
            self.spec.stats.verify_steps += 1
            self.spec.on_step(launched.forward_batch.num_tokens, res.seconds)
        elif batch.forward_mode.is_mixed():
            # Decode part first: its finished requests leave `running` before the new ones join.
            decode_out = LogitsOutput(next_token_logits=out.next_token_logits[n:])
            decode_err = {i - n: e for i, e in errors.items() if i >= n}
            self.process_decode_result(batch.decode_reqs, decode_out, ids[n:], decode_err)
            self.process_extend_result(batch.chunks, out, ids[:n], errors)
            self.stats.on_mixed(launched.forward_batch.num_tokens - batch.num_decode, batch.num_decode, res.seconds)
        elif batch.forward_mode.is_extend():
            self.process_extend_result(batch.chunks, out, ids, errors)
            self.stats.on_extend(launched.forward_batch.num_tokens, res.seconds)
        else:
            self.process_decode_result(batch.decode_reqs, out, ids, errors, launched.future_slots)
            self.stats.on_decode(len(batch.decode_reqs), res.seconds, launched.launch_time)
            if self.spec is not None:
                self.spec.on_step(len(batch.decode_reqs), res.seconds)
            if self.stats.decode_steps % self.server_args.decode_log_interval == 0:
                logger.info(self.stats.decode_log_line(self, len(self.running), len(self.waiting_queue)))
        for req in launched.deferred_release:
            self.cache_manager.release(req)

    def process_extend_result(self: "Scheduler", chunks: list[PrefillChunk], out: LogitsOutput, next_ids: list[int],
                              errors: dict[int, str]) -> None:
        for i, chunk in enumerate(chunks):
            req = chunk.req
            try:
                req.kv_committed_len = chunk.end
                if out.prompt_logprobs is not None and out.prompt_logprobs[i] is not None:
                    self.add_input_logprobs(req, out.prompt_logprobs[i], chunk)
                if not chunk.is_last:
                    self.cache_manager.cache_req(req, finished=False)
                    self.chunked_req = req
                    continue
                if i in errors:
                    req.abort(errors[i], 500)
                elif req.to_abort:
                    req.abort()
                elif req.sampling_params.max_new_tokens == 0:
                    req.finished_reason = {"type": "length", "length": 0}
                else:
                    self.append_token(req, next_ids[i], out.next_token_logits[i])
                if not req.finished() and self.try_jump_forward(req):
                    continue
                if req.finished():
                    self.finish_req(req)
                else:
                    self.cache_manager.cache_req(req, finished=False)
                    self.running.append(req)
                    self.emit(req)
            except Exception as e:  # noqa: BLE001 - this request fails, the batch goes on
                self.fail_request(req, e)

    def process_decode_result(self: "Scheduler", reqs: list[Req], out: LogitsOutput, next_ids: list[int],
                              errors: dict[int, str], slots=None, verified=None, drafts=None) -> None:
        """A decode step's tokens, or a verify step's (verified[i]: request i's emitted tokens
        for its draft drafts[i])."""
        running = {id(r) for r in self.running}
        for i, req in enumerate(reqs):
            if slots is not None and req.future_slot == slots[i]:
                req.future_slot = None
            if req.finished() or id(req) not in running:
                continue  # finished by the step before, while this one was in flight: dropped
            try:
                if i in errors:
                    req.kv_committed_len += 1
                    req.abort(errors[i], 500)
                elif drafts is not None and drafts[i]:
                    self.append_verified(req, drafts[i], verified[i], out.row_logits[i])
                else:
                    req.kv_committed_len += 1
                    self.append_token(req, next_ids[i], out.next_token_logits[i])
                if not req.finished() and self.try_jump_forward(req):
                    self.running.remove(req)
            except Exception as e:  # noqa: BLE001
                self.fail_request(req, e)
        for req in reqs:
            if req.finished() and req.holds_kv() and req in self.running:
                self.finish_req(req)
            elif not req.finished() and id(req) in running:
                self.emit(req)

    def append_verified(self: "Scheduler", req: Req, draft: list[int], tokens: list[int], rows: torch.Tensor) -> None:
        """A verify step's tokens for req, one by one as decoding would append them (logprobs from
        the row that predicted each, stop checks after each); the step wrote the KV of the next
        input and of every draft, so each appended token commits one more position. The KV of
        drafts that were rejected or fall after a stop is freed.

        A request that jump-forward may move (constrained, no logprobs) stops taking tokens where
        its grammar forces text: decoding would have jumped there (the caller does), and the
        forced text's canonical tokens can differ from those the model would pick one by one.
        Before that, each token is emitted as decoding emits it, since what was streamed is
        what a jump may not re-tokenize."""
        start, appended = req.kv_committed_len, 0
        may_jump = self.can_jump_forward(req)
        for j, tok in enumerate(tokens):
            req.kv_committed_len = start + j + 1
            self.append_token(req, tok, rows[j])
            appended += 1
            if req.finished():
                break
            if may_jump and j < len(tokens) - 1:
                if req.grammar.find_jump_forward_str():
                    break
                self.emit(req)
        accepted = len(tokens) - 1  # drafts the model agreed with (those after a stop are dropped)
        req.spec_verify_ct += 1
        req.spec_accepted_tokens += min(accepted, appended)
        self.spec.on_verified(req, len(draft), accepted)
        if not req.finished():
            self.cache_manager.free_uncommitted(req)

    def append_token(self: "Scheduler", req: Req, tok: int, logits_row: torch.Tensor) -> None:
        req.output_ids.append(tok)
        if req.grammar is not None and not req.grammar.accept_token(tok):
            logger.error("grammar rejected sampled token %d of request %s", tok, req.rid)
            req.abort("internal error: the grammar rejected a token", 500)
        if req.first_token_time is None:
            req.first_token_time = time.time()
        if req.return_logprob:
            lp = torch.log_softmax(logits_row, dim=-1)
            req.output_token_logprobs.append([float(lp[tok]), tok])
            if req.top_logprobs_num > 0:
                req.output_top_logprobs.append(_topk(lp, req.top_logprobs_num))
        if (req.sampling_params.stop_strs or req.sampling_params.stop_regex) and self.tokenizer is None:
            self.tokenizer = self._load_tokenizer()
        req.check_finished(self.tokenizer, self.context_len)

    def add_input_logprobs(self, req: Req, lp: torch.Tensor, chunk: PrefillChunk) -> None:
        """lp rows are positions chunk.logprob_start .. chunk.end - 1; row p predicts token p + 1.
        Adds the logprobs of the prompt tokens still owed that these rows predict."""
        first, ids = chunk.logprob_start, req.origin_input_ids
        assert lp.shape[0] == chunk.end - first, (req.rid, lp.shape, chunk)
        if req.logprob_pos == 0:  # the first token has no logprob
            req.input_token_logprobs.append([None, ids[0]])
            if req.top_logprobs_num > 0:
                req.input_top_logprobs.append(None)
            req.logprob_pos = 1
        lo, hi = req.logprob_pos, min(len(ids), chunk.end + 1)
        if hi <= lo:
            return
        assert lo - 1 >= first, (req.rid, lo, first)
        targets = torch.tensor(ids[lo:hi], dtype=torch.int64)
        rows = lp[lo - 1 - first : hi - 1 - first]
        vals = rows.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
        req.input_token_logprobs.extend([v, t] for v, t in zip(vals, ids[lo:hi]))
        if req.top_logprobs_num > 0:
            req.input_top_logprobs.extend(_topk(row, req.top_logprobs_num) for row in rows)
        req.logprob_pos = hi

    def can_jump_forward(self: "Scheduler", req: Req) -> bool:
        return self.jump_forward and req.grammar is not None and not req.return_logprob

    def try_jump_forward(self: "Scheduler", req: Req) -> bool:
        """Append the text req's grammar forces; the request then leaves the running batch and
        comes back through one extend step over the forced tokens (its prefix from the cache).
        Returns True when it was requeued."""
        if not self.can_jump_forward(req):
            return False
        assert self.inflight is None or not self.inflight.holds(req), "constrained requests never overlap"
        # Tokens that were streamed, or whose KV the tree shares, are never re-tokenized.
        frozen = max(req.sent_output_len, req.cache_protected_len - len(req.origin_input_ids), 0)
        jf = find_jump_forward(
            req.grammar, self.tokenizer, req.output_ids, len(req.output_ids) - frozen, req.sampling_params.max_new_tokens
        )
        if jf is None:
            return False
        # KV of re-tokenized tokens: the request's own, never the tree's.
        self.cache_manager.free_tail(req, min(req.kv_committed_len, len(req.origin_input_ids) + jf.keep))
        req.output_ids = req.output_ids[: jf.keep] + jf.new_tokens
        self.stats.jump_forward_tokens += len(jf.new_tokens)
        req.check_finished(self.tokenizer, self.context_len)
        if req.finished():
            return False  # the caller finishes it
        self.cache_manager.release(req)  # shares the valid prefix, releases slot and lock
        self.waiting_queue.insert(0, req)
        return True

    # ------------------------------------------------------------ finishing
    def finish_req(self: "Scheduler", req: Req) -> None:
        """req is finished: it leaves the running batch, its KV goes to the tree / free list (after
        the step in flight, if that step still uses it), and its last chunk goes out."""
        if req in self.running:
            self.running.remove(req)
        if self.spec is not None:
            self.spec.release(req)
        if self.chunked_req is req:
            self.chunked_req = None
        if self.inflight is not None and self.inflight.holds(req):
            self.inflight.deferred_release.append(req)
        else:
            self.cache_manager.release(req)
        self.emit(req)

    def fail_request(self: "Scheduler", req: Req, exc: BaseException) -> None:
        logger.exception("request %s failed", req.rid, exc_info=exc)
        req.finished_reason = None  # whatever it was about to finish with, it failed
        req.abort(f"internal error: {type(exc).__name__}: {exc}", 500)
        if req.holds_kv() or req in self.running:
            self.finish_req(req)
        else:  # it failed after its KV was released: only the news is left to send
            self.emit(req)

    def handle_forward_failure(self: "Scheduler", launched: LaunchedBatch, exc: BaseException) -> None:
        """The forward (or sampling) of a whole batch raised: its requests fail with the error, the
        scheduler goes on. Cross-step attention caches may be half-updated: wait for the worker,
        then drop them."""
        logger.error("a %s step of %d request(s) failed", launched.batch.forward_mode.name,
                     launched.batch.batch_size(), exc_info=exc)
        self.drain_worker()
        self.runner.attn_backend.reset()
        for req in launched.batch.reqs:
            if req.finished():
                continue  # finished by an earlier step; released below (or already)
            req.abort(f"internal error: {type(exc).__name__}: {exc}", 500)
            self.finish_req(req)
        for req in launched.deferred_release:
            self.cache_manager.release(req)

    # --------------------------------------------------------------- output
    def emit(self: "Scheduler", req: Req) -> None:
        """Queue the request's news for the detokenizer (finished, or streaming)."""
        if not req.finished() and not req.stream:
            return
        new = req.output_ids[req.sent_output_len :]
        if not req.finished() and len(new) < (req.sampling_params.stream_interval or self.server_args.stream_interval):
            return
        req.sent_output_len = len(req.output_ids)
        sp = req.sampling_params
        chunk = ReqOutputChunk(
            rid=req.rid,
            new_output_ids=new,
            finished_reason=req.finished_reason,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            skip_special_tokens=sp.skip_special_tokens,
            spaces_between_special_tokens=sp.spaces_between_special_tokens,
            trim_stop=not sp.no_stop_trim,
            stop_strs=sp.stop_strs or None,
            stop_regex=sp.stop_regex_list or None,
            forward_passes=req.forward_passes,
            spec_verify_ct=req.spec_verify_ct,
            spec_accepted_tokens=req.spec_accepted_tokens,
            first_token_time=req.first_token_time,
        )
        if req.return_logprob:
            chunk.input_token_logprobs, req.input_token_logprobs = req.input_token_logprobs, []
            chunk.input_top_logprobs, req.input_top_logprobs = req.input_top_logprobs, []
            chunk.output_token_logprobs, req.output_token_logprobs = req.output_token_logprobs, []
            chunk.output_top_logprobs, req.output_top_logprobs = req.output_top_logprobs, []
        self._out_chunks.append(chunk)

    def flush_outputs(self: "Scheduler") -> list[ReqOutputChunk]:
        chunks, self._out_chunks = self._out_chunks, []
        if chunks and hasattr(self, "send_to_detokenizer"):
            self.send_to_detokenizer.send_pyobj(BatchTokenIDOut(chunks))
        return chunks


def _topk(lp_row: torch.Tensor, k: int) -> list:
    vals, idx = torch.topk(lp_row, min(k, lp_row.shape[-1]))
    return [[v, i] for v, i in zip(vals.tolist(), idx.tolist())]
