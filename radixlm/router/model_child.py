"""One model's own server: a child `radixlm serve` on a free loopback port, in a process group of
its own, its output relayed to this process's log line by line. It is ready when its /health
answers 200; it stops with SIGTERM (it stops its engine and cleans up), then SIGKILL to the whole
group after a grace period, so that nothing it started outlives it. Each child also gets SIGTERM
from the kernel when this process dies (PR_SET_PDEATHSIG), a SIGKILL included."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import time

import httpx

from radixlm.utils import kill_itself_when_parent_died

logger = logging.getLogger(__name__)

REFUSAL_PREFIX = "radixlm: error: "  # the CLI's one error line, as it refuses an option


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildFailed(Exception):
    """The child exited or did not become healthy in time; the message says why (its refusal
    line, or the last lines it printed)."""


class ModelChild:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int):
        self.name, self.argv, self.env, self.port = name, argv, env, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self._relay: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,  # its own process group: stopped as one
            preexec_fn=lambda: kill_itself_when_parent_died(signal.SIGTERM),
        )
        self._relay = asyncio.ensure_future(self._relay_output())

    async def _relay_output(self) -> None:
        """The child's lines into this process's log (its load progress shows there), the last
        ones kept for the error when it fails."""
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.tail.append(line)
                logger.info("[%s] %s", self.name, line)

    def failure(self) -> str:
        lines = list(self.tail)
        refusals = [ln for ln in lines if ln.startswith(REFUSAL_PREFIX)]
        if refusals:
            return refusals[-1][len(REFUSAL_PREFIX) :]
        code = self.proc.returncode if self.proc else None
        return f"its server exited ({code}): " + " | ".join(lines[-5:])[-1500:]

    async def wait_healthy(self, client: httpx.AsyncClient, timeout: float) -> None:
        """Until GET /health answers 200; ChildFailed when it exits first or `timeout` passes."""
        assert self.proc is not None
        start = time.monotonic()
        next_note = start + 10.0
        while True:
            if self.proc.returncode is not None:
                if self._relay is not None:
                    await asyncio.wait({self._relay}, timeout=2.0)  # its last lines
                raise ChildFailed(self.failure())
            try:
                r = await client.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            now = time.monotonic()
            if now - start > timeout:
                raise ChildFailed(
                    f"it did not become healthy in {timeout:g} s (--model-load-timeout)"
                )
            if now >= next_note:  # progress while a big model loads
                logger.info("model %s still loading (%.0f s)", self.name, now - start)
                next_note = now + 10.0
            await asyncio.sleep(0.2)

    async def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the server, then SIGKILL to its whole group: nothing of it is left."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(self.proc.wait(), grace)
            except (ProcessLookupError, TimeoutError):
                pass
        self.kill_group()
        await self.proc.wait()
        if self._relay is not None:
            await asyncio.wait({self._relay}, timeout=2.0)

    def kill_group(self) -> None:
        """SIGKILL to every process left in the child's group (at exit, from any thread)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
