"""The decode server's PD mode: a request with a bootstrap room never prefills here.

    KV_BOOTSTRAP   (holds nothing) the prefill server's route is looked up at its bootstrap service;
                   once known and the pool has room for the prompt plus --num-reserved-decode-tokens,
                   the request takes a row, its cached prefix from this server's own radix cache
                   (earlier turns' KV stays here) and slots for the rest; the prefill server is told
                   where to write them
    KV_TRANSFER    (holds the row and the slots) the KV arrives into the slots (the receiver thread
                   writes it, or the prefill wrote the shared pool); the aux record brings the first
                   output token, its logprobs, the prompt logprobs and the cached-token count
    RUNNING        the prompt's KV goes into the radix cache, as after a local prefill; decoding goes on

A request that times out (--disaggregation-bootstrap-timeout, --disaggregation-waiting-timeout),
is aborted or fails on the prefill side releases what it holds and ends with a 5xx (or the abort).
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import logging
import time

from radixlm.disaggregation.config import DisaggregationConfig
from radixlm.disaggregation.decode_transfer import DecodeTransfer
from radixlm.disaggregation.protocol import AuxRecord
from radixlm.ipc import TokenizedGenerateReqInput
from radixlm.scheduler.pd.context import BasePDMode, PDContext
from radixlm.scheduler.req import Req, ReqStatus

logger = logging.getLogger(__name__)
S = ReqStatus


class PDDecode(BasePDMode):
    def __init__(self, config: DisaggregationConfig, ctx: PDContext, kv_pool):
        self.config = config
        self.queues = ctx.queues
        self.cache_manager = ctx.cache_manager
        self.finisher = ctx.finisher
        self.outputs = ctx.outputs
        self.tokenizer = ctx.tokenizer
        self.context_len = ctx.context_len
        self.max_running = ctx.max_running_requests
        self.transfer = DecodeTransfer(config, kv_pool)
        self.since: dict[int, float] = {}  # id(req) -> when it entered its PD state
        self.routes: dict[int, dict] = {}  # id(req) -> the prefill rank's route (KV_TRANSFER)

    def on_add(self, recv: TokenizedGenerateReqInput) -> TokenizedGenerateReqInput:
        return recv  # the request as sent: its bootstrap room says where its KV comes from

    def ready_status(self, req: Req) -> ReqStatus:
        if req.bootstrap is None or req.sampling_params.max_new_tokens == 0:
            return S.WAITING  # no transfer: served whole here
        self.since[id(req)] = time.monotonic()
        return S.KV_BOOTSTRAP

    def pending(self) -> bool:
        return bool(self.queues.kv_bootstrap or self.queues.kv_transfer)

    def poll(self) -> None:
        now, arrived = time.monotonic(), False
        for req in list(self.queues.kv_transfer):
            aux = self.transfer.arrived(req.bootstrap.room)
            if aux is not None and aux.error:
                self._fail(req, f"the prefill server failed: {aux.error}")
            elif aux is not None:
                self._complete(req, aux)
                arrived = True
            elif req.to_abort:
                self._fail(req, "aborted", None)
            elif now - self.since[id(req)] > self.config.waiting_timeout:
                self._fail(
                    req,
                    f"the KV did not arrive within {self.config.waiting_timeout:g} s "
                    "(--disaggregation-waiting-timeout)",
                )
        if arrived:  # the first tokens go out now, not with the next decode step's
            self.outputs.flush()
        for req in list(self.queues.kv_bootstrap):
            if req.to_abort:
                self._fail(req, "aborted", None)
            elif not self._try_reserve(req, now):
                break  # first come, first served: later requests wait behind this one

    def _try_reserve(self, req: Req, now: float) -> bool:
        """False when req must keep waiting (no route yet, or no room)."""
        info = req.bootstrap
        route = self.transfer.route(info)
        if route is None:
            if now - self.since[id(req)] > self.config.bootstrap_timeout:
                self._fail(
                    req,
                    f"the bootstrap service at {info.host}:{info.port} did not answer within "
                    f"{self.config.bootstrap_timeout:g} s ({self.transfer.route_error(info)})",
                )
            # still being looked up: the requests behind it (other prefill servers) may go on
            return True
        problem = self.transfer.check_route(route)
        if problem:
            self._fail(req, problem)
            return True
        cm = self.cache_manager
        if (
            cm.req_to_token_pool.available_size() == 0
            or len(self.queues.holders()) >= self.max_running
        ):
            return False
        req.logprob_pos = len(req.origin_input_ids)  # prompt logprobs come from the prefill side
        indices, node = cm.match(req)
        cm.lock(node)
        prompt_len, prefix_len = len(req.origin_input_ids), len(indices)
        need = prompt_len - prefix_len
        reserve = min(self.config.num_reserved_decode_tokens, req.sampling_params.max_new_tokens)
        if cm.kv_room() < need + reserve:
            cm.unlock(node)
            if now - self.since[id(req)] > self.config.bootstrap_timeout:
                self._fail(
                    req,
                    f"no KV room for {need + reserve} tokens within"
                    f" {self.config.bootstrap_timeout:g} s",
                )
                return True
            return False
        cm.assign(req, indices, node)
        slots = cm.alloc_kv(need)
        if slots is None:  # not after the kv_room check; never keep a half-reserved request
            cm.release(req)
            return False
        cm.req_to_token_pool.req_to_token[req.req_pool_idx, prefix_len:prompt_len] = slots
        req.kv_allocated_len = prompt_len
        self.transfer.start(info.room, route, slots.clone(), prefix_len)
        self.routes[id(req)] = route
        self.since[id(req)] = now
        self.queues.move(req, S.KV_TRANSFER)
        return True

    def _complete(self, req: Req, aux: AuxRecord) -> None:
        """The KV and the aux record are here: the request goes on as after a local prefill."""
        checksum = self.transfer.finish(req.bootstrap.room, self.routes.pop(id(req)), ok=True)
        self.since.pop(id(req), None)
        try:
            if self.config.debug_checksum and checksum != aux.checksum:
                raise RuntimeError(
                    f"the received KV's checksum {checksum} differs from the sent {aux.checksum}"
                )
            req.kv_committed_len = len(req.origin_input_ids)
            req.cached_tokens = aux.cached_tokens
            req.forward_passes += 1
            if req.return_logprob:
                req.input_token_logprobs, req.input_top_logprobs = (
                    aux.input_token_logprobs,
                    aux.input_top_logprobs,
                )
                req.output_token_logprobs = list(aux.output_token_logprobs)
                req.output_top_logprobs = list(aux.output_top_logprobs)
            req.output_ids.append(aux.first_token)
            req.first_token_time = time.time()
            if req.grammar is not None and not req.grammar.accept_token(aux.first_token):
                req.abort(
                    "internal error: the grammar rejected the prefill server's first token", 500
                )
            sp = req.sampling_params
            req.check_finished(
                self.tokenizer.get() if sp.stop_strs or sp.stop_regex else None, self.context_len
            )
            if req.finished():
                self.finisher.finish(req)
                return
            self.cache_manager.cache_req(
                req, finished=False
            )  # this server's own cache of what it received
            self.queues.move(req, S.RUNNING)
            self.outputs.emit(req)
        except Exception as e:
            self.finisher.fail(req, e)

    def _fail(self, req: Req, error: str, status: int | None = 500) -> None:
        route = self.routes.pop(id(req), None)
        self.since.pop(id(req), None)
        if route is not None:
            self.transfer.finish(req.bootstrap.room, route, ok=False, reason=error)
        logger.warning("request %s (bootstrap_room %d): %s", req.rid, req.bootstrap.room, error)
        req.abort(f"PD disaggregation: {error}", status)
        self.finisher.finish(req)

    def info(self) -> dict:
        return {
            "disaggregation": {
                **self.transfer.info(),
                "waiting_for_prefill": len(self.queues.kv_bootstrap),
            }
        }
