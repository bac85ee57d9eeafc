"""The scheduler process: waiting queue -> prefill / decode batches -> model -> results.

Each iteration builds one batch: a prefill (extend) batch when waiting requests fit
the KV budget, otherwise a decode batch of everything running. It owns the KV pools,
the radix tree and the model runner.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import torch
import zmq

from radixlm.cache.radix_cache import RadixCache
from radixlm.config import PortArgs, ServerArgs
from radixlm.constrained.jump_forward import find_jump_forward
from radixlm.ipc import (
    AbortReq,
    BatchTokenIDOut,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    ReqOutputChunk,
    TokenizedGenerateReqInput,
)
from radixlm.model.forward_batch import ForwardMode
from radixlm.model.layers.sampler import SamplingBatchInfo
from radixlm.model.runner import LogitsOutput, ModelRunner
from radixlm.scheduler.batch import Req, ScheduleBatch
from radixlm.scheduler.overlap import FutureTokenMap, LaunchedBatch, can_overlap
from radixlm.scheduler.policy import PrefillAdder, SchedulePolicy, shares_prefix_in_batch
from radixlm.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, server_args: ServerArgs, port_args: Optional[PortArgs], runner: Optional[ModelRunner] = None):
        self.server_args = server_args
        self.runner = runner or ModelRunner(server_args)
        self.device = self.runner.device
        self.req_to_token_pool = self.runner.req_to_token_pool
        self.token_to_kv_pool = self.runner.token_to_kv_pool
        self.tree_cache = RadixCache(
            self.req_to_token_pool, self.token_to_kv_pool, disable=server_args.disable_radix_cache
        )
        self.policy = SchedulePolicy(
            server_args.schedule_policy, self.tree_cache, server_args.disable_radix_cache, server_args.random_seed
        )
        self.context_len = self.runner.context_len
        self.eos_token_ids = frozenset(self.runner.loaded.eos_token_ids)
        self.tokenizer = None  # loaded on first stop string
        self.waiting_queue: list[Req] = []
        # Requests whose grammar is compiling on the backend's thread pool.
        self.grammar_queue: list[Req] = []
        self.grammar_backend = None  # created on the first constrained request
        self.running: list[Req] = []
        self.chunked_req: Optional[Req] = None
        self.new_token_ratio = server_args.new_token_ratio
        self.stats = SchedulerStats(self.runner.max_total_num_tokens)
        # LPM-like policies hold back a request whose prefix another admitted request is computing.
        self.dedup_in_batch = server_args.schedule_policy in ("lpm", "dfs-weight") and not server_args.disable_radix_cache
        self.jump_forward = not (server_args.disable_jump_forward or server_args.disable_radix_cache)
        self.chunk_size = None if server_args.chunked_prefill_size == -1 else server_args.chunked_prefill_size
        self._out_chunks: list[ReqOutputChunk] = []
        # Overlap scheduling (overlap.py): the decode step in flight on the worker thread.
        self.overlap = server_args.overlap_schedule
        self.inflight: Optional[LaunchedBatch] = None
        if self.overlap:
            self.worker = ThreadPoolExecutor(1, thread_name_prefix="radixlm-forward")
            self.future_map = FutureTokenMap(2 * self.runner.max_running_requests + 2, self.device)

        if port_args is not None:
            ctx = zmq.Context(2)
            self.recv_from_tokenizer = ctx.socket(zmq.PULL)
            self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
            self.send_to_detokenizer = ctx.socket(zmq.PUSH)
            self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
            self.send_to_tokenizer = ctx.socket(zmq.PUSH)
            self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)

    def info(self) -> dict:
        r = self.runner
        return {
            "max_total_num_tokens": r.max_total_num_tokens,
            "kv_cache_bytes": r.token_to_kv_pool.total_bytes,
            "context_len": r.context_len,
            "max_running_requests": r.max_running_requests,
            "vocab_size": r.vocab_size,
            "architecture": r.loaded.architecture,
            "model_path": r.loaded.model_path,
            "eos_token_ids": sorted(self.eos_token_ids),
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------ loop
    def event_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.recv_from_tokenizer, zmq.POLLIN)
        while True:
            idle = not (self.waiting_queue or self.running or self.chunked_req or self.inflight)
            if idle:
                if self.server_args.debug_memory_check and not self.grammar_queue:
                    self.check_memory()
                poller.poll(2 if self.grammar_queue else 1000)
            for msg in self._drain():
                self.handle(msg)
            self.step()

    def _drain(self):
        while True:
            try:
                yield self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return

    def handle(self, msg) -> None:
        if isinstance(msg, TokenizedGenerateReqInput):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort_request(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            self.send_to_tokenizer.send_pyobj(self.flush_cache())
        elif isinstance(msg, GetInternalStateReq):
            self.send_to_tokenizer.send_pyobj(GetInternalStateReqOutput(self.internal_state()))
        else:
            logger.error("unknown message %r", type(msg))

    def step(self) -> None:
        """One iteration: build a batch, run it, process and send its results. With overlap,
        a decode step stays in flight while the next one is built and launched."""
        if self.grammar_queue:
            self.move_ready_grammar_requests()
        prev, self.inflight = self.inflight, None
        if prev is not None:
            self.step_overlapped(prev)
        else:
            batch = self.get_next_batch_to_run()
            if batch is not None:
                launched = self.launch(batch)
                if self.overlap and batch.forward_mode.is_decode() and can_overlap(batch.reqs, self.context_len):
                    self.inflight = launched
                else:
                    self.process_result(launched)
        self.flush_outputs()

    def step_overlapped(self, prev: LaunchedBatch) -> None:
        """prev: a decode step in flight. Launch what comes next, then process prev."""
        prefill = self.get_new_batch_prefill()
        if prefill is not None:  # new requests need nothing of prev: prefill them behind it
            launched = self.launch(prefill)
            self.process_result(prev)
            self.process_result(launched)
            return
        room = self.kv_room()
        if not self.running or not can_overlap(self.running, self.context_len) or room < len(self.running):
            self.process_result(prev)  # the next step needs prev's tokens (or a retraction): wait
            return
        self.decay_new_token_ratio()
        self.inflight = self.launch(ScheduleBatch(list(self.running), ForwardMode.DECODE))
        self.process_result(prev)

    # -------------------------------------------------------------- requests
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        req = Req(
            rid=recv.rid,
            origin_input_ids=list(recv.input_ids),
            sampling_params=recv.sampling_params,
            eos_token_ids=self.eos_token_ids,
            return_logprob=recv.return_logprob,
            logprob_start_len=recv.logprob_start_len,
            top_logprobs_num=recv.top_logprobs_num,
            stream=recv.stream,
            priority=recv.priority,
            input_text=recv.input_text,
        )
        error = None
        if not req.origin_input_ids:
            error = "the prompt is empty"
        elif len(req.origin_input_ids) >= self.context_len:
            error = f"the prompt has {len(req.origin_input_ids)} tokens; the context length is {self.context_len}"
        key = req.sampling_params.grammar_key
        if not error and key is not None:
            try:
                backend = self.get_grammar_backend()
                req.grammar = backend.get_future(key)
            except Exception as e:  # noqa: BLE001 - a missing backend is this request's error
                error = f"structured output unavailable: {e}"
        if error:
            req.finished_reason = {"type": "abort", "message": error, "status_code": 400}
            self.emit(req)
            return
        if req.grammar is not None:
            self.grammar_queue.append(req)
            self.move_ready_grammar_requests()  # a cached grammar is ready at once
            return
        self.waiting_queue.append(req)

    def get_grammar_backend(self):
        if self.grammar_backend is None:
            from radixlm.constrained import create_grammar_backend

            if self.tokenizer is None:
                self.tokenizer = self._load_tokenizer()
            self.grammar_backend = create_grammar_backend(
                self.server_args.grammar_backend, self.tokenizer, self.runner.vocab_size,
                eos_token_ids=sorted(self.eos_token_ids),
            )
            if self.grammar_backend is None:
                raise ValueError("the server runs with --grammar-backend none")
        return self.grammar_backend

    def move_ready_grammar_requests(self) -> None:
        from radixlm.constrained import InvalidGrammar

        for req in [r for r in self.grammar_queue if r.grammar.done() or r.to_abort]:
            self.grammar_queue.remove(req)
            if req.to_abort:
                req.grammar.cancel()
                req.finished_reason = {"type": "abort", "message": "aborted"}
                self.emit(req)
                continue
            grammar = req.grammar.result()
            if isinstance(grammar, InvalidGrammar):
                kind = {"json": "json_schema", "regex": "regex", "ebnf": "ebnf"}[grammar.key[0]]
                msg = f"invalid sampling_params.{kind}: {grammar.message}"
                req.finished_reason = {"type": "abort", "message": msg, "status_code": 400}
                self.emit(req)
                continue
            req.grammar = grammar
            self.waiting_queue.append(req)

    def abort_request(self, rid: str) -> None:
        for req in self.grammar_queue:
            if rid in ("", req.rid):
                req.to_abort = True
        for req in list(self.waiting_queue):
            if rid in ("", req.rid):
                self.waiting_queue.remove(req)
                req.finished_reason = {"type": "abort", "message": "aborted"}
                self.emit(req)
        for req in self.running + ([self.chunked_req] if self.chunked_req else []):
            if rid in ("", req.rid):
                req.to_abort = True

    def flush_cache(self) -> FlushCacheReqOutput:
        if self.waiting_queue or self.running or self.chunked_req or self.grammar_queue:
            return FlushCacheReqOutput(False, "requests are running")
        self.tree_cache.reset()
        self.token_to_kv_pool.clear()
        self.req_to_token_pool.clear()
        self.stats.reset_cache_stats()
        return FlushCacheReqOutput(True)

    def internal_state(self) -> dict:
        return {
            "max_total_num_tokens": self.runner.max_total_num_tokens,
            "available_kv_tokens": self.token_to_kv_pool.available_size(),
            "evictable_tokens": self.tree_cache.evictable_size(),
            "protected_tokens": self.tree_cache.protected_size(),
            "req_slots_total": self.req_to_token_pool.size,
            "req_slots_free": self.req_to_token_pool.available_size(),
            "num_running": len(self.running) + (1 if self.chunked_req else 0),
            "num_waiting": len(self.waiting_queue) + len(self.grammar_queue),
            **self.stats.as_dict(),
        }

    def check_memory(self) -> None:
        """DESIGN.md §4: at an idle point every KV slot is free or held by the tree."""
        free = self.token_to_kv_pool.available_size()
        tree = self.tree_cache.evictable_size() + self.tree_cache.protected_size()
        total = self.runner.max_total_num_tokens
        assert self.tree_cache.protected_size() == 0, "a lock leaked at an idle point"
        assert free + tree == total, f"KV leak: free {free} + tree {tree} != {total}"
        assert self.req_to_token_pool.available_size() == self.req_to_token_pool.size, "request slot leak"

    # ------------------------------------------------------------- batching
    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return self.mix_with_running(batch) if self.server_args.enable_mixed_chunk else batch
        if self.running:
            return self.update_running_batch()
        return None

    def get_new_batch_prefill(self) -> Optional[ScheduleBatch]:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        if len(self.running) >= self.runner.max_running_requests and self.chunked_req is None:
            return None
        reserve = sum(PrefillAdder.reserve_for(r, self.new_token_ratio) for r in self.running)
        adder = PrefillAdder(
            tree_cache=self.tree_cache,
            rem_total_tokens=self.kv_room() - reserve,
            rem_input_tokens=self.server_args.max_prefill_tokens,
            rem_chunk_tokens=self.chunk_size,
            new_token_ratio=self.new_token_ratio,
            free_req_slots=min(
                self.req_to_token_pool.available_size(),
                self.runner.max_running_requests - len(self.running),
            ),
        )
        nothing_running = not self.running
        if self.chunked_req is not None:
            req, self.chunked_req = self.chunked_req, None
            if req.to_abort:  # before init_next_round_input: fill_ids must match its KV
                req.finished_reason = {"type": "abort", "message": "aborted"}
                self.release(req)
                self.emit(req)
            else:
                req.init_next_round_input(self.tree_cache)
                adder.add_one_req(req, nothing_running)
                if req not in adder.can_run:  # no room now: it stays the pending chunked request
                    self.chunked_req = req
                    return None
        if adder.new_chunked_req is None:
            self.policy.calc_priority(self.waiting_queue)
            for req in self.waiting_queue:
                if len(adder.can_run) + len(self.running) >= self.runner.max_running_requests:
                    break
                req.init_next_round_input(self.tree_cache)
                if self.dedup_in_batch and shares_prefix_in_batch(req, adder.can_run):
                    continue  # it will hit the cache next round instead of computing the prefix twice
                if not adder.add_one_req(req, nothing_running):
                    break
        if not adder.can_run:
            return None
        admitted = set(map(id, adder.can_run))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        for r in adder.can_run:
            if r.forward_passes == 0:
                r.cached_tokens = len(r.prefix_indices)
                self.stats.on_prefill(len(r.origin_input_ids), r.cached_tokens)
        return ScheduleBatch(adder.can_run, ForwardMode.EXTEND)

    def kv_room(self) -> int:
        """KV slots an allocation can get: free ones plus evictable radix-tree leaves."""
        return self.token_to_kv_pool.available_size() + self.tree_cache.evictable_size()

    def finish_aborted_running(self) -> None:
        """Aborted running requests finish before their next step takes a KV slot."""
        for r in self.running:
            r.check_finished(None, self.context_len)
        self._finish([r for r in self.running if r.finished()])

    def update_running_batch(self) -> ScheduleBatch:
        self.finish_aborted_running()
        if not self.running:
            return None
        need = len(self.running)
        if self.kv_room() < need:
            self.retract_decode(need)
        else:
            self.decay_new_token_ratio()
        return ScheduleBatch(list(self.running), ForwardMode.DECODE)

    def mix_with_running(self, prefill: ScheduleBatch) -> ScheduleBatch:
        """prefill plus a decode step of every running request, when the pool has a slot for each
        (else the prefill alone, and the decode step follows as usual)."""
        self.finish_aborted_running()
        if not self.running:
            return prefill
        need = sum(r.extend_input_len for r in prefill.reqs) + len(self.running)
        if self.kv_room() < need:
            return prefill
        self.decay_new_token_ratio()
        return ScheduleBatch.mixed(prefill, list(self.running))

    def decay_new_token_ratio(self) -> None:
        self.new_token_ratio = max(
            self.server_args.min_new_token_ratio, self.new_token_ratio - self.server_args.new_token_ratio_decay
        )

    def retract_decode(self, need: int) -> None:
        """Out of KV for one more decode step: free requests (fewest outputs first) and requeue
        them; they resume later by re-prefilling prompt + outputs (mostly from the cache)."""
        order = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
        retracted = []
        while len(order) > 1:
            room = self.kv_room()
            if room >= len(order):
                break
            req = order.pop()
            self.tree_cache.cache_finished_req(req)
            req.reset_for_retract()
            retracted.append(req)
        self.running = [r for r in self.running if r in order]
        self.waiting_queue = retracted + self.waiting_queue
        self.new_token_ratio = 1.0
        self.stats.num_retracted += len(retracted)
        logger.warning("KV cache full: retracted %d request(s); %d keep running", len(retracted), len(self.running))
        if self.kv_room() < len(self.running):
            # A lone request never outgrows the pool (context_len <= pool size); defensive only.
            for r in self.running:
                r.finished_reason = {"type": "abort", "message": "out of KV cache memory"}
            self._finish(list(self.running))

    # --------------------------------------------------------------- running
    def launch(self, batch: ScheduleBatch) -> LaunchedBatch:
        """Prepare the batch here; run forward + sampling on the worker thread (inline without
        overlap). Decode steps store their sampled ids in future slots for the next step."""
        prepare = batch.prepare_for_extend if batch.forward_mode.is_extend() else batch.prepare_for_decode
        fb = prepare(self.req_to_token_pool, self.token_to_kv_pool, self.tree_cache, self.device)
        reqs = batch.reqs
        info = SamplingBatchInfo.build(
            [r.sampling_params for r in reqs],
            self.runner.vocab_size,
            self.device,
            output_ids=[r.output_ids for r in reqs],
            prompt_ids=[r.origin_input_ids for r in reqs],
            generators=[r.generator for r in reqs],
            banned_ids=[r.banned_token_ids() for r in reqs],
        )
        slots = None
        if self.overlap and batch.forward_mode.is_decode():
            slots = self.future_map.alloc(len(reqs))
            for r, slot in zip(reqs, slots):
                r.future_slot = slot
        has_future = any(r.placeholder_pos is not None for r in reqs)
        launch_time = time.perf_counter()
        if self.overlap:
            result = self.worker.submit(self._forward_and_sample, batch, fb, info, slots, has_future)
        else:
            result = Future()
            result.set_result(self._forward_and_sample(batch, fb, info, slots, has_future))
        return LaunchedBatch(batch, fb, result, slots, launch_time)

    def _forward_and_sample(self, batch: ScheduleBatch, fb, info, slots, has_future: bool):
        t0 = time.perf_counter()
        if has_future:
            fb.input_ids = self.future_map.resolve(fb.input_ids)
        out = self.runner.forward(fb)
        next_ids = self.runner.sample(self.grammar_masked(batch, out.next_token_logits), info)
        if slots is not None:
            self.future_map.store(torch.tensor(slots, dtype=torch.int64, device=self.device), next_ids)
        return out, next_ids, time.perf_counter() - t0

    def process_result(self, launched: LaunchedBatch) -> None:
        out, next_ids, seconds = launched.result.result()
        batch, next_ids = launched.batch, next_ids.tolist()
        if batch.forward_mode.is_mixed():
            n = len(batch.reqs) - batch.num_decode
            # Decode part first: its finished requests leave `running` before the new ones join.
            decode_out = LogitsOutput(next_token_logits=out.next_token_logits[n:])
            self.process_decode_result(ScheduleBatch(batch.decode_reqs, ForwardMode.DECODE), decode_out, next_ids[n:])
            self.process_extend_result(ScheduleBatch(batch.prefill_reqs, ForwardMode.EXTEND), out, next_ids[:n])
            self.stats.on_mixed(launched.forward_batch.num_tokens - batch.num_decode, batch.num_decode, seconds)
        elif batch.forward_mode.is_extend():
            self.process_extend_result(batch, out, next_ids)
            self.stats.on_extend(launched.forward_batch.num_tokens, seconds)
        else:
            self.process_decode_result(batch, out, next_ids, launched.future_slots)
            self.stats.on_decode(len(batch.reqs), seconds, launched.launch_time)
            if self.stats.decode_steps % self.server_args.decode_log_interval == 0:
                logger.info(self.stats.decode_log_line(self, len(self.running), len(self.waiting_queue)))

    def grammar_masked(self, batch: ScheduleBatch, logits: torch.Tensor) -> torch.Tensor:
        """Logits with each constrained request's disallowed tokens at -inf (a copy: logprobs
        are reported from the model's own distribution). Rows without a grammar stay as they are."""
        rows = [i for i, r in enumerate(batch.reqs) if r.grammar is not None and not r.is_chunked]
        if not rows:
            return logits
        t0 = time.perf_counter()
        backend = self.grammar_backend
        mask = backend.allocate_vocab_mask(self.runner.vocab_size, len(batch.reqs))
        backend.fill_vocab_masks([batch.reqs[i].grammar for i in rows], mask, rows)
        logits = logits.clone()
        backend.apply_vocab_mask(logits, backend.move_vocab_mask(mask, logits.device))
        self.stats.grammar_mask_seconds += time.perf_counter() - t0
        self.stats.grammar_mask_steps += 1
        return logits

    def process_extend_result(self, batch: ScheduleBatch, out: LogitsOutput, next_ids: list[int]) -> None:
        for i, req in enumerate(batch.reqs):
            if out.prompt_logprobs is not None and out.prompt_logprobs[i] is not None:
                self._add_input_logprobs(req, out.prompt_logprobs[i], len(req.fill_ids))
            if req.is_chunked:
                self.tree_cache.cache_unfinished_req(req)
                self.chunked_req = req
                continue
            req.input_logprobs_done = True
            req.prefilled = True
            if req.to_abort:
                req.finished_reason = {"type": "abort", "message": "aborted"}
            elif req.sampling_params.max_new_tokens == 0:
                req.finished_reason = {"type": "length", "length": 0}
            else:
                self._append_token(req, next_ids[i], out.next_token_logits[i])
            if not req.finished() and self.try_jump_forward(req):
                continue
            if req.finished():
                self._finish([req])
            else:
                self.tree_cache.cache_unfinished_req(req)
                self.running.append(req)
                self.emit(req)

    def process_decode_result(self, batch: ScheduleBatch, out: LogitsOutput, next_ids: list[int],
                              slots: Optional[list[int]] = None) -> None:
        for i, req in enumerate(batch.reqs):
            if slots is not None and req.future_slot == slots[i]:
                req.future_slot = None
            if req.finished():  # finished by the step before, while this one was in flight: drop
                continue
            if req.placeholder_pos is not None:  # the step after this one was launched already
                req.fill_ids[req.placeholder_pos] = next_ids[i]
                req.placeholder_pos = None
            self._append_token(req, next_ids[i], out.next_token_logits[i])
            if not req.finished() and self.try_jump_forward(req):
                self.running.remove(req)
        done = [r for r in batch.reqs if r.finished() and r.req_pool_idx is not None]
        self._finish(done)
        for r in batch.reqs:
            if not r.finished():
                self.emit(r)

    def try_jump_forward(self, req: Req) -> bool:
        """Append the text req's grammar forces; the request then leaves the running batch and
        comes back through one extend step over the forced tokens (its prefix from the cache).
        Returns True when it was requeued."""
        if not self.jump_forward or req.grammar is None or req.return_logprob:
            return False
        # Tokens that were streamed, or whose KV the tree shares, are never re-tokenized.
        frozen = max(req.sent_output_len, len(req.prefix_indices) - len(req.origin_input_ids), 0)
        jf = find_jump_forward(
            req.grammar, self.tokenizer, req.output_ids, len(req.output_ids) - frozen, req.sampling_params.max_new_tokens
        )
        if jf is None:
            return False
        valid = min(len(req.fill_ids), len(req.origin_input_ids) + jf.keep)
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        if valid < len(req.fill_ids):  # KV of re-tokenized tokens: the request's own, never the tree's
            self.token_to_kv_pool.free(row[valid : len(req.fill_ids)].clone())
            req.fill_ids = req.fill_ids[:valid]
        req.output_ids = req.output_ids[: jf.keep] + jf.new_tokens
        self.stats.jump_forward_tokens += len(jf.new_tokens)
        req.check_finished(self.tokenizer, self.context_len)
        if req.finished():
            return False  # the caller finishes it
        self.tree_cache.cache_finished_req(req)  # shares the valid prefix, releases slot and lock
        req.reset_for_retract(retracted=False)
        self.waiting_queue.insert(0, req)
        return True

    def _append_token(self, req: Req, tok: int, logits_row: torch.Tensor) -> None:
        req.output_ids.append(tok)
        if req.grammar is not None and not req.grammar.accept_token(tok):
            logger.error("grammar rejected sampled token %d of request %s", tok, req.rid)
            req.finished_reason = {"type": "abort", "message": "internal error: the grammar rejected a token"}
        if req.first_token_time is None:
            req.first_token_time = time.time()
        if req.return_logprob:
            lp = torch.log_softmax(logits_row, dim=-1)
            req.output_token_logprobs.append([float(lp[tok]), tok])
            if req.top_logprobs_num > 0:
                req.output_top_logprobs.append(_topk(lp, req.top_logprobs_num))
        if req.sampling_params.stop_strs and self.tokenizer is None:
            self.tokenizer = self._load_tokenizer()
        req.check_finished(self.tokenizer, self.context_len)

    def _add_input_logprobs(self, req: Req, lp: torch.Tensor, end: int) -> None:
        """lp rows are positions first..end-1; row p predicts token p + 1."""
        first = end - lp.shape[0]
        ids, start = req.origin_input_ids, req.logprob_start_len
        if start == 0 and first == 0:
            req.input_token_logprobs.append([None, ids[0]])
            if req.top_logprobs_num > 0:
                req.input_top_logprobs.append(None)
        lo = max(start, first + 1)
        hi = min(len(ids), end + 1)
        if hi <= lo:
            return
        targets = torch.tensor(ids[lo:hi], dtype=torch.int64)
        rows = lp[lo - 1 - first : hi - 1 - first]
        vals = rows.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
        req.input_token_logprobs.extend([v, t] for v, t in zip(vals, ids[lo:hi]))
        if req.top_logprobs_num > 0:
            req.input_top_logprobs.extend(_topk(row, req.top_logprobs_num) for row in rows)

    def _finish(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.release(req)
            if req in self.running:
                self.running.remove(req)
            self.emit(req)

    def release(self, req: Req) -> None:
        if req.req_pool_idx is not None:
            self.tree_cache.cache_finished_req(req)
            req.req_pool_idx = None

    # --------------------------------------------------------------- output
    def emit(self, req: Req) -> None:
        """Queue the request's news for the detokenizer (finished, or streaming)."""
        if not req.finished() and not req.stream:
            return
        new = req.output_ids[req.sent_output_len :]
        if not req.finished() and not new:
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
            forward_passes=req.forward_passes,
            first_token_time=req.first_token_time,
        )
        if req.return_logprob:
            chunk.input_token_logprobs, req.input_token_logprobs = req.input_token_logprobs, []
            chunk.input_top_logprobs, req.input_top_logprobs = req.input_top_logprobs, []
            chunk.output_token_logprobs, req.output_token_logprobs = req.output_token_logprobs, []
            chunk.output_top_logprobs, req.output_top_logprobs = req.output_top_logprobs, []
        self._out_chunks.append(chunk)

    def flush_outputs(self) -> list[ReqOutputChunk]:
        chunks, self._out_chunks = self._out_chunks, []
        if chunks and hasattr(self, "send_to_detokenizer"):
            self.send_to_detokenizer.send_pyobj(BatchTokenIDOut(chunks))
        return chunks

    def _load_tokenizer(self):
        from radixlm.model.loader import load_tokenizer

        return load_tokenizer(self.server_args.tokenizer_path or self.runner.loaded.model_path)


def _topk(lp_row: torch.Tensor, k: int) -> list:
    vals, idx = torch.topk(lp_row, min(k, lp_row.shape[-1]))
    return [[v, i] for v, i in zip(vals.tolist(), idx.tolist())]


def run_scheduler_process(server_args: ServerArgs, port_args: PortArgs, pipe_writer) -> None:
    """Entry point of the scheduler process."""
    from radixlm.utils import configure_logging, kill_itself_when_parent_died

    configure_logging(server_args.log_level, prefix="scheduler")
    kill_itself_when_parent_died()
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    try:
        scheduler = Scheduler(server_args, port_args)
        pipe_writer.send({"status": "ready", **scheduler.info()})
    except Exception as e:  # report load errors to the launcher instead of dying silently
        logger.exception("scheduler failed to start")
        pipe_writer.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        return
    scheduler.event_loop()
