"""The prefill server's PD mode: a request with a bootstrap room runs its prompt as usual
(chunked, through the radix cache) and samples its first output token; then, instead of
releasing its KV, it waits in KV_TRANSFER holding it while the KV goes to the slots the decode
server reserved (disaggregation/prefill_transfer.py), and finishes when the decode side
acknowledges (its answer then reaches the router) or fails (a 500; its KV is released either way).

    KVPoll per room: BOOTSTRAPPING (no TransferDest from the decode side yet)
                     -> TRANSFERRING (KV and aux record sent) -> SUCCESS | FAILED
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from radixlm.disaggregation.config import DisaggregationConfig
from radixlm.disaggregation.prefill_transfer import PrefillTransfer
from radixlm.disaggregation.protocol import AuxRecord, KVPoll, TransferDest
from radixlm.ipc import FinishAbort, TokenizedGenerateReqInput
from radixlm.scheduler.output.finisher import Finisher
from radixlm.scheduler.pd.context import BasePDMode, PDContext
from radixlm.scheduler.req import Req, ReqStatus

logger = logging.getLogger(__name__)
S = ReqStatus


@dataclass
class _Room:
    since: float  # when the request entered this phase
    poll: KVPoll = KVPoll.BOOTSTRAPPING
    dest: TransferDest | None = None
    aux: AuxRecord | None = None


class PDPrefillFinisher(Finisher):
    """A finished request with a bootstrap room keeps its KV (KV_TRANSFER) until it was sent."""

    pd: PDPrefill | None = None

    def finish(self, req: Req) -> None:
        if (
            self.pd is not None
            and req.bootstrap is not None
            and req.status is not S.KV_TRANSFER
            and not isinstance(req.finished_reason, FinishAbort)
            and req.holds_kv()
            and req.output_ids
            and not self.in_flight.holds(req)
        ):
            self.pd.begin(req)
            return
        super().finish(req)


class PDPrefill(BasePDMode):
    def __init__(self, config: DisaggregationConfig, ctx: PDContext, kv_pool):
        self.config = config
        self.queues = ctx.queues
        self.cache_manager = ctx.cache_manager
        self.finisher = ctx.finisher
        self.finisher.pd = self
        self.transfer = PrefillTransfer(config, kv_pool)
        self.rooms: dict[int, _Room] = {}  # id(req) -> its transfer

    def on_add(self, recv: TokenizedGenerateReqInput) -> TokenizedGenerateReqInput:
        if recv.bootstrap is None:
            return recv  # an ordinary request (warm-up, health checks): served whole here
        # The prefill computes the first output token only; the decode server generates the rest.
        sp = dataclasses.replace(
            recv.sampling_params, max_new_tokens=min(1, recv.sampling_params.max_new_tokens)
        )
        return dataclasses.replace(recv, sampling_params=sp)

    def ready_status(self, req: Req) -> ReqStatus:
        return S.WAITING  # a prefill server prefills every request

    def begin(self, req: Req) -> None:
        self.queues.move(req, S.KV_TRANSFER)
        self.rooms[id(req)] = _Room(time.monotonic())

    def pending(self) -> bool:
        return bool(self.queues.kv_transfer)

    def poll(self) -> None:
        now = time.monotonic()
        for req in list(self.queues.kv_transfer):
            room = self.rooms[id(req)]
            if req.to_abort:
                self._end(req, room, "aborted", None)
            elif room.poll is KVPoll.BOOTSTRAPPING:
                self._try_send(req, room, now)
            else:
                state = self.transfer.poll(req.bootstrap.room)
                if state is KVPoll.SUCCESS:
                    self._end(req, room, None)
                elif state is KVPoll.FAILED:
                    self._end(
                        req,
                        room,
                        f"the transfer failed: {self.transfer.failure(req.bootstrap.room)}",
                    )
                elif now - room.since > self.config.waiting_timeout:
                    self._end(
                        req,
                        room,
                        "the decode server did not acknowledge the KV within "
                        f"{self.config.waiting_timeout:g} s (--disaggregation-waiting-timeout)",
                    )

    def _try_send(self, req: Req, room: _Room, now: float) -> None:
        dest = self.transfer.dest(req.bootstrap.room)
        if dest is None:
            if now - room.since > self.config.bootstrap_timeout:
                self._end(
                    req,
                    room,
                    f"no decode server reserved slots for bootstrap_room {req.bootstrap.room}"
                    f" within {self.config.bootstrap_timeout:g} s"
                    " (--disaggregation-bootstrap-timeout)",
                )
            return
        room.dest = dest
        prompt_len = len(req.origin_input_ids)
        problem = self.transfer.check_dest(dest, prompt_len)
        if problem:
            self._end(req, room, problem)
            return
        room.aux = AuxRecord(
            room=dest.room,
            first_token=req.output_ids[0],
            output_token_logprobs=list(req.output_token_logprobs),
            output_top_logprobs=list(req.output_top_logprobs),
            input_token_logprobs=list(req.input_token_logprobs),
            input_top_logprobs=list(req.input_top_logprobs),
            cached_tokens=req.cached_tokens,
            num_tokens=prompt_len - dest.prefix_len,
        )
        row = self.cache_manager.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.transfer.send(dest, row[dest.prefix_len : prompt_len], room.aux)
        room.poll, room.since = KVPoll.TRANSFERRING, now

    def _end(self, req: Req, room: _Room, error: str | None, status: int | None = 500) -> None:
        """The transfer is over: the request finishes (its KV released), failed with `error` if
        given."""
        del self.rooms[id(req)]
        self.transfer.forget(req.bootstrap.room, ok=error is None)
        if error is not None:
            logger.warning("request %s (bootstrap_room %d): %s", req.rid, req.bootstrap.room, error)
            if (
                room.dest is not None
            ):  # the decode side frees its slots now rather than at its timeout
                self.transfer.fail(room.dest, AuxRecord(room.dest.room, -1, error=error))
            req.finished_reason = None
            req.abort(f"PD disaggregation: {error}", status)
        self.finisher.finish(req)

    def info(self) -> dict:
        sending = sum(r.poll is KVPoll.TRANSFERRING for r in self.rooms.values())
        return {
            "disaggregation": {
                **self.transfer.info(),
                "rooms_in_flight": len(self.rooms),
                "rooms_sending": sending,
            }
        }
