"""TPSchedulerIO: the channels of one rank of a tensor-parallel scheduler group.

Rank 0 owns the real channels (SchedulerIO: requests from the tokenizer manager, output to the
detokenizer, control replies). Each step it broadcasts what it received over the group's gloo
group (broadcast_pyobj), and every rank handles the same messages in the same order; the other
ranks wait in that broadcast. Only rank 0 sends: the others' outputs are the same and are dropped.
"""

from __future__ import annotations

from typing import Any

from radixlm.distributed.communicator import Communicator
from radixlm.ipc import BatchTokenIDOut
from radixlm.scheduler.channels import BaseSchedulerIO


class TPSchedulerIO(BaseSchedulerIO):
    def __init__(self, comm: Communicator, inner: BaseSchedulerIO | None):
        """inner: rank 0's channels (None on the other ranks)."""
        if (comm.rank == 0) != (inner is not None):
            raise ValueError("rank 0, and only rank 0, has the scheduler's channels")
        self.comm = comm
        self.inner = inner

    def recv_requests(self, timeout_ms: int) -> list[Any]:
        msgs = self.inner.recv_requests(timeout_ms) if self.inner is not None else None
        return self.comm.broadcast_pyobj(msgs, src=0)

    def send_output(self, out: BatchTokenIDOut) -> None:
        if self.inner is not None:
            self.inner.send_output(out)

    def reply(self, msg: Any) -> None:
        if self.inner is not None:
            self.inner.reply(msg)
