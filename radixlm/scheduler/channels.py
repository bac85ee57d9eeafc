"""The scheduler's channels to the other processes (docs/architecture.md, "Channels").

SchedulerIO is the ZMQ implementation; tests drive a scheduler in-process with their own
BaseSchedulerIO (tests/scheduler/harness.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import zmq

from radixlm.config import PortArgs
from radixlm.ipc import BatchTokenIDOut


class BaseSchedulerIO(ABC):
    @abstractmethod
    def recv_requests(self, timeout_ms: int) -> list[Any]:
        """Every message that arrived; waits up to timeout_ms for the first one (0: never waits)."""

    @abstractmethod
    def send_output(self, out: BatchTokenIDOut) -> None:
        """A step's news, to the detokenizer."""

    @abstractmethod
    def reply(self, msg: Any) -> None:
        """A control call's answer, to the tokenizer manager."""


class SchedulerIO(BaseSchedulerIO):
    def __init__(self, port_args: PortArgs):
        ctx = zmq.Context(2)
        self.recv_from_tokenizer = ctx.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
        self.send_to_detokenizer = ctx.socket(zmq.PUSH)
        self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
        self.send_to_tokenizer = ctx.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)

    def recv_requests(self, timeout_ms: int) -> list[Any]:
        if timeout_ms > 0:
            self.poller.poll(timeout_ms)
        msgs = []
        while True:
            try:
                msgs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                return msgs

    def send_output(self, out: BatchTokenIDOut) -> None:
        self.send_to_detokenizer.send_pyobj(out)

    def reply(self, msg: Any) -> None:
        self.send_to_tokenizer.send_pyobj(msg)
