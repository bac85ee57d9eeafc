"""DPSchedulerIO: the channels of one DP-attention rank (docs/architecture.md, "DP attention").

Each rank runs its own scheduler over its own requests. Rank 0 owns the input channel: each step it
takes what the tokenizer manager sent, has the dispatcher name a rank for every new request
(dp_dispatch.py; aborts, control calls and session messages go to every rank) and broadcasts the
list over the world's gloo group; every rank keeps its own part. Every rank sends its requests'
news to the detokenizer itself. Control answers go to rank 0 (a socket of their own), which sends
one merged answer when every rank gave its own (dp_replies.py).

Rank 0 waits for messages only as long as every rank could (DPView.timeouts_ms, from the last
step's exchange): a rank with work to do never waits on rank 0's idle poll.
"""

from __future__ import annotations

from typing import Any

import zmq

from radixlm.config import PortArgs
from radixlm.distributed.communicator import Communicator
from radixlm.ipc import BatchTokenIDOut, TokenizedGenerateReqInput
from radixlm.scheduler.channels import BaseSchedulerIO, SchedulerIO
from radixlm.scheduler.parallel.dp_dispatch import DPDispatcher, DPView
from radixlm.scheduler.parallel.dp_replies import ReplyMerger


class DPSchedulerIO(BaseSchedulerIO):
    def __init__(
        self,
        comm: Communicator,
        port_args: PortArgs,
        view: DPView,
        dispatcher: DPDispatcher | None,
    ):
        """dispatcher: rank 0's (None on the other ranks)."""
        if (comm.rank == 0) != (dispatcher is not None):
            raise ValueError("rank 0, and only rank 0, dispatches the requests")
        self.comm, self.view, self.dispatcher = comm, view, dispatcher
        ctx = zmq.Context(1)
        if comm.rank == 0:
            self.inner = SchedulerIO(port_args)
            self.replies_in = ctx.socket(zmq.PULL)
            self.replies_in.bind(port_args.dp_reply_ipc_name)
            self.inner.poller.register(self.replies_in, zmq.POLLIN)
            self.merger = ReplyMerger(comm.world_size, self.inner.reply)
        else:
            self.to_detokenizer = ctx.socket(zmq.PUSH)
            self.to_detokenizer.connect(port_args.detokenizer_ipc_name)
            self.replies_out = ctx.socket(zmq.PUSH)
            self.replies_out.connect(port_args.dp_reply_ipc_name)

    def recv_requests(self, timeout_ms: int) -> list[Any]:
        routed = None
        if self.comm.rank == 0:
            msgs = self.inner.recv_requests(min([timeout_ms, *self.view.timeouts_ms[1:]]))
            self._take_replies()
            routed = [(self.dispatcher.assign(m), m) for m in msgs]
        routed = self.comm.broadcast_pyobj(routed, src=0)
        if any(isinstance(m, TokenizedGenerateReqInput) for _, m in routed):
            self.view.stale = True  # the ranks' counts miss these until the next step's exchange
        return [m for rank, m in routed if rank is None or rank == self.comm.rank]

    def _take_replies(self) -> None:
        while True:
            try:
                rank, msg = self.replies_in.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.merger.add(rank, msg)

    def send_output(self, out: BatchTokenIDOut) -> None:
        if self.comm.rank == 0:
            self.inner.send_output(out)
        else:
            self.to_detokenizer.send_pyobj(out)

    def reply(self, msg: Any) -> None:
        if self.comm.rank == 0:
            self.merger.add(0, msg)
        else:
            self.replies_out.send_pyobj((self.comm.rank, msg))
