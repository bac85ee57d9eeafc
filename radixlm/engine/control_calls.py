"""Control calls from the tokenizer manager to the scheduler (flush the cache, read its state, the
RL, LoRA and profiler calls): each sends one request and waits for the reply, which comes back on
the tokenizer socket. Replies are matched to their waiters by type, in order. A ControlFailed reply
(the scheduler's handler raised) fails its waiter with a generic error; a dead engine fails them
all (fail_all)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from radixlm.ipc import ControlFailed

R = TypeVar("R")


class ControlCalls:
    def __init__(self, send: Callable[[Any], None], check_alive: Callable[[], None]):
        """send: pushes a request to the scheduler; check_alive: raises when the engine is dead."""
        self._send = send
        self._check_alive = check_alive
        self._waiters: dict[type, list[asyncio.Future]] = {}
        self._sent: dict[asyncio.Future, float] = {}  # calls in flight: when each was sent

    async def call(self, req: Any, reply_type: type[R]) -> R:
        """Send `req`; its reply (of type `reply_type`)."""
        self._check_alive()
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(reply_type, []).append(fut)
        self._sent[fut] = time.perf_counter()
        try:
            self._send(req)
            return await fut
        finally:
            self._sent.pop(fut, None)

    def deliver(self, msg: Any) -> bool:
        """Hand a control call's reply to its waiter; False when `msg` is no such reply."""
        failed = isinstance(msg, ControlFailed)
        if not failed and type(msg) not in self._waiters:
            return False
        waiters = self._waiters.get(msg.reply_type if failed else type(msg), [])
        if waiters:
            fut = waiters.pop(0)
            if not fut.done():
                if failed:  # the HTTP layer answers a generic 500
                    fut.set_exception(
                        RuntimeError(f"the scheduler failed a {msg.reply_type.__name__} call")
                    )
                else:
                    fut.set_result(msg)
        return True

    def sent_times(self) -> list[float]:
        """When each call still waiting was sent (time.perf_counter). Read by the watchdog thread:
        a copy (atomic under the GIL)."""
        return list(self._sent.values())

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Every waiting call raises a new `error()`."""
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(error())
