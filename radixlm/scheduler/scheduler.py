"""The scheduler process: waiting queue -> prefill / decode batches -> model -> results.

Each iteration builds one batch: a prefill (extend) batch when waiting requests fit the KV
budget, otherwise a decode batch of everything running. It owns the KV pools, the radix tree
(through the cache manager) and the model runner. Result processing is output_processor.py's,
admission admission.py's, queue order policy.py's.
See docs/architecture.md, "Request flow" (steps 3-6) and "KV ownership".
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

from radixlm.cache.hiradix_cache import HiRadixCache, create_hiradix_cache
from radixlm.cache.radix_cache import RadixCache
from radixlm.config import PortArgs, ServerArgs
from radixlm.ipc import (
    AbortReq,
    FLUSH_LEVELS,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    ReqOutputChunk,
    TokenizedGenerateReqInput,
)
from radixlm.model.forward_batch import ForwardMode
from radixlm.model.layers.sampler import SamplingBatchInfo
from radixlm.model.runner import ModelRunner
from radixlm.scheduler.admission import PrefillAdder, reserve_for, shares_prefix_in_batch
from radixlm.scheduler.batch import ScheduleBatch
from radixlm.scheduler.cache_manager import CacheManager
from radixlm.scheduler.invariants import InvariantError, check_invariants
from radixlm.scheduler.output_processor import SchedulerOutputProcessorMixin
from radixlm.scheduler.overlap import FutureTokenMap, LaunchedBatch, StepOutput, can_overlap
from radixlm.scheduler.policy import SchedulePolicy
from radixlm.scheduler.req import Req
from radixlm.sampling_params import brief_repr
from radixlm.scheduler.stats import SchedulerStats
from radixlm.speculative.controller import SpecController
from radixlm.speculative.draft_source import create_draft_source
from radixlm.speculative.grammar import masked_draft_rows
from radixlm.speculative.verify import accept_draft

logger = logging.getLogger(__name__)


class Scheduler(SchedulerOutputProcessorMixin):
    def __init__(self, server_args: ServerArgs, port_args: Optional[PortArgs], runner: Optional[ModelRunner] = None):
        self.server_args = server_args
        self.runner = runner or ModelRunner(server_args)
        self.device = self.runner.device
        self.req_to_token_pool = self.runner.req_to_token_pool
        self.token_to_kv_pool = self.runner.token_to_kv_pool
        self.hicache: Optional[HiRadixCache] = None
        if server_args.enable_hierarchical_cache:
            self.tree_cache = self.hicache = create_hiradix_cache(server_args, self.runner, self._load_tokenizer)
        else:
            self.tree_cache = RadixCache(self.token_to_kv_pool, disable=server_args.disable_radix_cache)
        self.cache_manager = CacheManager(self.req_to_token_pool, self.token_to_kv_pool, self.tree_cache)
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
        # Requests waiting for their prefix's KV to be read from storage (hierarchical cache, L3).
        self.prefetch_queue: list[Req] = []
        self.running: list[Req] = []
        # The request being prefilled in chunks, between its chunks (it holds its row and lock).
        self.chunked_req: Optional[Req] = None
        self.new_token_ratio = server_args.new_token_ratio
        self.stats = SchedulerStats(self.runner.max_total_num_tokens)
        self.invariant_checks = server_args.enable_invariant_checks
        # LPM-like policies hold back a request whose prefix another admitted request is computing.
        self.dedup_in_batch = server_args.schedule_policy in ("lpm", "dfs-weight") and not server_args.disable_radix_cache
        self.jump_forward = not (server_args.disable_jump_forward or server_args.disable_radix_cache)
        self.chunk_size = None if server_args.chunked_prefill_size == -1 else server_args.chunked_prefill_size
        self._out_chunks = []
        # Overlap scheduling (overlap.py): the decode step in flight on the worker thread.
        self.overlap = server_args.overlap_schedule
        self.inflight: Optional[LaunchedBatch] = None
        # Speculative decoding (radixlm/speculative/): drafts verified in TARGET_VERIFY steps.
        self.spec: Optional[SpecController] = None
        if server_args.speculative_algorithm:
            source = create_draft_source(server_args.speculative_algorithm, server_args, self.tree_cache,
                                         target_vocab_size=self.runner.vocab_size)
            self.spec = SpecController(source, server_args.speculative_num_draft_tokens,
                                       server_args.speculative_draft_policy)
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
    def is_idle(self) -> bool:
        return not (self.waiting_queue or self.running or self.chunked_req or self.inflight or self.grammar_queue
                    or self.prefetch_queue)

    def event_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.recv_from_tokenizer, zmq.POLLIN)
        while True:
            if not (self.waiting_queue or self.running or self.chunked_req or self.inflight):
                poller.poll(2 if self.grammar_queue or self.prefetch_queue else 1000)
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
        try:
            if isinstance(msg, TokenizedGenerateReqInput):
                self.add_request(msg)
            elif isinstance(msg, AbortReq):
                self.abort_request(msg.rid)
            elif isinstance(msg, FlushCacheReq):
                self.send_to_tokenizer.send_pyobj(self.flush_cache(msg.level))
            elif isinstance(msg, GetInternalStateReq):
                self.send_to_tokenizer.send_pyobj(GetInternalStateReqOutput(self.internal_state()))
            else:
                logger.error("unknown message %r", type(msg))
        except InvariantError:
            raise
        except Exception as e:  # noqa: BLE001 - one bad message must not stop the server
            logger.exception("handling %s failed", type(msg).__name__)
            if isinstance(msg, TokenizedGenerateReqInput):
                self._reject(msg.rid, len(msg.input_ids), f"internal error: {type(e).__name__}: {e}", 500)

    def step(self) -> None:
        """One iteration: build a batch, run it, process and send its results. With overlap,
        a decode step stays in flight while the next one is built and launched."""
        if self.grammar_queue:
            self.move_ready_grammar_requests()
        if self.hicache is not None and self.hicache.prefetches:
            self.move_prefetched_requests()
        prev, self.inflight = self.inflight, None
        if prev is not None:
            self.step_overlapped(prev)
        else:
            batch = self.get_next_batch_to_run()
            if batch is not None:
                launched = self.launch(batch)
                if self.overlap and batch.forward_mode.is_decode() and can_overlap(batch.decode_reqs, self.context_len):
                    self.inflight = launched
                else:
                    self.process_result(launched)
        self.flush_outputs()
        if self.invariant_checks:
            self.check_invariants()

    def step_overlapped(self, prev: LaunchedBatch) -> None:
        """prev: a decode step in flight. Launch what comes next, then process prev."""
        prefill = self.get_new_batch_prefill()
        if prefill is not None:  # new requests need nothing of prev: prefill them behind it
            launched = self.launch(prefill)
            self.process_result(prev)
            self.process_result(launched)
            return
        room = self.cache_manager.kv_room()
        if not self.running or not can_overlap(self.running, self.context_len) or room < len(self.running):
            self.process_result(prev)  # the next step needs prev's tokens (or a retraction): wait
            return
        self.decay_new_token_ratio()
        self.inflight = self.launch(ScheduleBatch(ForwardMode.DECODE, decode_reqs=list(self.running)))
        self.process_result(prev)

    def check_invariants(self) -> None:
        holders = list(self.running) + ([self.chunked_req] if self.chunked_req else [])
        if self.inflight is not None:
            holders += self.inflight.deferred_release
        check_invariants(self.cache_manager, holders, self.waiting_queue + self.grammar_queue + self.prefetch_queue)

    # -------------------------------------------------------------- requests
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        n = len(recv.input_ids)
        error = None
        if not recv.input_ids:
            error = "the prompt is empty"
        elif n >= self.context_len:
            error = f"the prompt has {n} tokens; the context length is {self.context_len}"
        elif recv.return_logprob and recv.logprob_start_len >= n:
            error = f"logprob_start_len {recv.logprob_start_len} is not below the prompt length {n}"
        if error:
            self._reject(recv.rid, n, error, 400)
            return
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
        if self.hicache is not None:
            req.prefetch = self.hicache.start_prefetch(req.all_ids()[: req.max_prefix_len()])
        key = req.sampling_params.grammar_key
        if key is not None:
            try:
                req.grammar = self.get_grammar_backend().get_future(key)
            except Exception as e:  # noqa: BLE001 - a missing backend is this request's error
                req.abort(f"structured output unavailable: {e}", 400)
                self.emit(req)
                return
            self.grammar_queue.append(req)
            self.move_ready_grammar_requests()  # a cached grammar is ready at once
            return
        self._enqueue(req)

    def _enqueue(self, req: Req) -> None:
        """A request ready but for its prefix's L3 read waits for that; else it is schedulable."""
        if req.prefetch is not None and not req.prefetch.done:
            self.prefetch_queue.append(req)
        else:
            self.waiting_queue.append(req)

    def move_prefetched_requests(self) -> None:
        self.hicache.poll_prefetches()
        for req in [r for r in self.prefetch_queue if r.prefetch.done]:
            self.prefetch_queue.remove(req)
            self.waiting_queue.append(req)

    def _reject(self, rid: str, prompt_len: int, message: str, status_code: int) -> None:
        reason = {"type": "abort", "message": message, "status_code": status_code}
        self._out_chunks.append(ReqOutputChunk(rid, [], reason, prompt_tokens=prompt_len, completion_tokens=0,
                                               cached_tokens=0))

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
                req.abort()
                self.emit(req)
                continue
            try:
                grammar = req.grammar.result()
            except Exception as e:  # noqa: BLE001 - a compile that crashed fails its request only
                grammar = InvalidGrammar(req.sampling_params.grammar_key, f"{type(e).__name__}: {e}")
            if isinstance(grammar, InvalidGrammar):
                kind = {"json": "json_schema"}.get(grammar.key[0], grammar.key[0])
                req.abort(f"invalid sampling_params.{kind}: {grammar.message}", 400)
                self.emit(req)
                continue
            req.grammar = grammar
            self._enqueue(req)

    def abort_request(self, rid: str) -> None:
        for req in self.grammar_queue:
            if rid in ("", req.rid):
                req.to_abort = True
        for queue in (self.prefetch_queue, self.waiting_queue):
            for req in [r for r in queue if rid in ("", r.rid)]:
                queue.remove(req)
                req.abort()
                if self.spec is not None:  # a retracted request keeps its drafting state
                    self.spec.release(req)
                self.emit(req)
        req = self.chunked_req
        if req is not None and rid in ("", req.rid):  # between its chunks: no step uses it
            req.abort()
            self.finish_req(req)
        for req in self.running:
            if rid in ("", req.rid):
                req.to_abort = True

    def flush_cache(self, level: str = "l1") -> FlushCacheReqOutput:
        """Empty the cache: L1 (the KV pool), or with the hierarchical cache down to "l2" or "l3"."""
        if not self.is_idle():
            return FlushCacheReqOutput(False, "requests are running")
        if level not in FLUSH_LEVELS:
            return FlushCacheReqOutput(False, f"level must be one of {', '.join(FLUSH_LEVELS)}, got {brief_repr(level)}")
        self.cache_manager.flush(level)
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
            **(self.spec.stats.as_dict() if self.spec else {}),
            **({"hicache": self.hicache.info()} if self.hicache is not None else {}),
        }

    # ------------------------------------------------------------- batching
    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return self.mix_with_running(batch) if self.server_args.enable_mixed_chunk else batch
        return self.update_running_batch()

    def get_new_batch_prefill(self) -> Optional[ScheduleBatch]:
        max_running = self.runner.max_running_requests
        if not self.waiting_queue and self.chunked_req is None:
            return None
        if len(self.running) >= max_running and self.chunked_req is None:
            return None
        reserve = sum(reserve_for(r, self.new_token_ratio) for r in self.running)
        adder = PrefillAdder(
            cache=self.cache_manager,
            rem_total_tokens=self.cache_manager.kv_room() - reserve,
            rem_input_tokens=self.server_args.max_prefill_tokens,
            rem_chunk_tokens=self.chunk_size,
            new_token_ratio=self.new_token_ratio,
            free_req_slots=min(self.req_to_token_pool.available_size(), max_running - len(self.running)),
            nothing_running=not self.running,
        )
        if self.chunked_req is not None:
            if not adder.add_chunked_req(self.chunked_req):
                return None  # no room for its next chunk now: it stays the pending chunked request
            self.chunked_req = None  # in this batch; back as chunked_req if this chunk is not its last
        # Order the queue only when some request could be admitted: a cache-aware policy walks
        # the tree for every waiting request.
        if self.waiting_queue and adder.can_admit_more():
            prefix_len = self.policy.calc_priority(self.waiting_queue)
            for req in self.waiting_queue:
                if len(adder.chunks) + len(self.running) >= max_running:
                    break
                if self.dedup_in_batch and shares_prefix_in_batch(
                    req, [c.req for c in adder.chunks], lambda r=req: self._prefix_len(r, prefix_len)
                ):
                    continue  # it will hit the cache next round instead of computing the prefix twice
                if not adder.add_one_req(req):
                    break
        if not adder.chunks:
            return None
        admitted = {id(c.req) for c in adder.chunks}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        for c in adder.chunks:
            r = c.req
            if r.forward_passes == 0:
                r.cached_tokens = c.start
                self.stats.on_prefill(len(r.origin_input_ids), r.cached_tokens)
        return ScheduleBatch(ForwardMode.EXTEND, chunks=adder.chunks)

    def _prefix_len(self, req: Req, known: dict[int, int]) -> int:
        if id(req) not in known:
            known[id(req)] = len(self.cache_manager.match(req, split=False)[0])
        return known[id(req)]

    def finish_aborted_running(self) -> None:
        """Aborted running requests finish before their next step takes a KV slot."""
        for r in [r for r in self.running if r.to_abort]:
            r.abort()
            self.finish_req(r)

    def update_running_batch(self) -> Optional[ScheduleBatch]:
        self.finish_aborted_running()
        if not self.running:
            return None
        if self.cache_manager.kv_room() < len(self.running):
            self.retract_decode()
        else:
            self.decay_new_token_ratio()
        if not self.running:
            return None
        if self.spec is not None:
            spare = self.cache_manager.kv_room() - len(self.running)
            drafts = self.spec.propose(self.running, spare, self.context_len)
            if any(drafts):
                return ScheduleBatch(ForwardMode.TARGET_VERIFY, decode_reqs=list(self.running), drafts=drafts)
        return ScheduleBatch(ForwardMode.DECODE, decode_reqs=list(self.running))

    def mix_with_running(self, prefill: ScheduleBatch) -> ScheduleBatch:
        """prefill plus a decode step of every running request, when the pool has a slot for each
        (else the prefill alone, and the decode step follows as usual)."""
        self.finish_aborted_running()
        if not self.running:
            return prefill
        need = sum(c.length for c in prefill.chunks) + len(self.running)
        if self.cache_manager.kv_room() < need:
            return prefill
        self.decay_new_token_ratio()
        return ScheduleBatch(ForwardMode.MIXED, chunks=prefill.chunks, decode_reqs=list(self.running))

    def decay_new_token_ratio(self) -> None:
        self.new_token_ratio = max(
            self.server_args.min_new_token_ratio, self.new_token_ratio - self.server_args.new_token_ratio_decay
        )

    def retract_decode(self) -> None:
        """Out of KV for one more decode step. Requeue, in this order, the request being prefilled
        in chunks, then running requests (fewest outputs first) until the rest fit; they resume
        later by re-prefilling prompt + outputs (mostly from the cache). Never all of them: the
        last one always fits unless it alone outgrows the pool."""
        assert self.inflight is None, "retraction needs every step processed"
        cm = self.cache_manager
        retracted = []
        if self.chunked_req is not None and cm.kv_room() < len(self.running):
            retracted.append(self.chunked_req)
            self.chunked_req = None
        order = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
        for req in retracted:
            cm.release(req)
        while len(order) > 1 and cm.kv_room() < len(order):
            req = order.pop()
            cm.release(req)
            retracted.append(req)
        for req in retracted:
            req.retracted += 1
        self.running = [r for r in self.running if r in order]
        self.waiting_queue = retracted + self.waiting_queue
        self.new_token_ratio = 1.0
        self.stats.num_retracted += len(retracted)
        logger.warning("KV cache full: retracted %d request(s); %d keep running", len(retracted), len(self.running))
        if cm.kv_room() < len(self.running):
            (req,) = self.running
            if req.seqlen + 1 <= self.runner.max_total_num_tokens:
                raise InvariantError(f"a lone request ({req.seqlen} tokens) finds no KV slot in a pool of "
                                     f"{self.runner.max_total_num_tokens}: something else holds KV")
            req.abort("out of KV cache memory")
            self.finish_req(req)

    # --------------------------------------------------------------- running
    def launch(self, batch: ScheduleBatch) -> LaunchedBatch:
        """Prepare the batch and its attention metadata here; run forward + sampling on the worker
        thread (inline without overlap). Decode steps store their sampled ids in future slots for
        the next step. A failure past the slot allocation is the batch's (process_result)."""
        fb = batch.prepare(self.cache_manager, self.device)
        # Inputs the step in flight is still sampling (their requests' future slots are its).
        has_future = any(r.future_slot is not None for r in batch.decode_reqs)
        slots = None
        if self.overlap and batch.forward_mode.is_decode():
            slots = self.future_map.alloc(batch.batch_size())
            for r, slot in zip(batch.decode_reqs, slots):
                r.future_slot = slot
        launch_time = time.perf_counter()
        try:
            args = (batch, fb, self._sampling_info(batch), slots, has_future)
            self.runner.init_forward_metadata(fb)
            if self.overlap:
                result = self.worker.submit(self._forward_and_sample, *args)
            else:
                result = Future()
                result.set_result(self._forward_and_sample(*args))
        except Exception as e:  # noqa: BLE001 - reported by process_result
            result = Future()
            result.set_exception(e)
        return LaunchedBatch(batch, fb, result, slots, launch_time)

    def _sampling_info(self, batch: ScheduleBatch) -> SamplingBatchInfo:
        reqs, keeps = batch.reqs, batch.sampling_rows()
        return SamplingBatchInfo.build(
            [r.sampling_params for r in reqs],
            self.runner.vocab_size,
            self.device,
            output_ids=[r.output_ids for r in reqs],
            prompt_ids=[r.origin_input_ids for r in reqs],
            # A middle chunk's sample is dropped: it must not consume a seeded request's draws.
            generators=[r.generator if keep else None for r, keep in zip(reqs, keeps)],
            banned_ids=[r.banned_token_ids() for r in reqs],
        )

    def _forward_and_sample(self, batch: ScheduleBatch, fb, info, slots, has_future: bool) -> StepOutput:
        t0 = time.perf_counter()
        if has_future:
            fb.input_ids = self.future_map.resolve(fb.input_ids)
        out = self.runner.forward(fb)
        logits, errors = self.grammar_masked(batch, out.next_token_logits)
        next_ids = self.runner.sample(logits, info)
        if slots is not None:
            self.future_map.store(torch.tensor(slots, dtype=torch.int64, device=self.device), next_ids)
        next_ids = next_ids.tolist()
        verified = None
        if batch.forward_mode.is_verify():
            verified = [self._verify(r, d, out.row_logits[i], errors, i) if d else [next_ids[i]]
                        for i, (r, d) in enumerate(zip(batch.decode_reqs, batch.drafts))]
        return StepOutput(out, next_ids, time.perf_counter() - t0, errors, verified)

    def _verify(self, req: Req, draft: list[int], rows: torch.Tensor, errors: dict[int, str], i: int) -> list[int]:
        """The tokens req emits for its draft; a constrained request's rows masked first."""
        if req.grammar is not None:
            try:
                rows = masked_draft_rows(self.grammar_backend, req.grammar, draft, rows)
            except Exception as e:  # noqa: BLE001 - this request fails (process_decode_result), not the batch
                errors[i] = f"internal error: grammar mask: {type(e).__name__}: {e}"
                return []
        return accept_draft(rows, draft, req.sampling_params, req.generator)

    def drain_worker(self) -> None:
        """Wait until the worker has run everything handed to it."""
        if self.overlap:
            self.worker.submit(lambda: None).result()

    def grammar_masked(self, batch: ScheduleBatch, logits: torch.Tensor):
        """Logits with each constrained row's disallowed tokens at -inf (a copy: logprobs are
        reported from the model's own distribution), and the rows whose mask failed. A middle
        chunk's row is left alone: its sample is dropped and its grammar has not started."""
        rows = [i for i, (r, keep) in enumerate(zip(batch.reqs, batch.sampling_rows())) if keep and r.grammar is not None]
        if not rows:
            return logits, {}
        t0 = time.perf_counter()
        backend, reqs, errors = self.grammar_backend, batch.reqs, {}
        mask = backend.allocate_vocab_mask(self.runner.vocab_size, len(reqs))
        try:
            backend.fill_vocab_masks([reqs[i].grammar for i in rows], mask, rows)
        except Exception:  # noqa: BLE001 - find the failing row(s); the others keep their masks
            for i in rows:
                try:
                    backend.fill_vocab_masks([reqs[i].grammar], mask, [i])
                except Exception as e:  # noqa: BLE001
                    errors[i] = f"internal error: grammar mask: {type(e).__name__}: {e}"
        logits = logits.clone()
        backend.apply_vocab_mask(logits, backend.move_vocab_mask(mask, logits.device))
        self.stats.grammar_mask_seconds += time.perf_counter() - t0
        self.stats.grammar_mask_steps += 1
        return logits, errors

    def _load_tokenizer(self):
        from radixlm.model.loader import load_tokenizer

        return load_tokenizer(self.server_args.tokenizer_path or self.runner.loaded.model_path)


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
    if scheduler.hicache is not None and scheduler.hicache.io is not None:
        def finish_stores(*_):  # stores queued for L3 are what the next start serves from
            scheduler.hicache.io.wait_writes(timeout=4.0)
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, finish_stores)
    try:
        scheduler.event_loop()
    except InvariantError:
        logger.exception("scheduler invariant broken: stopping")
        raise
