"""A radixlm server in a child process: started, health-checked and stopped from Python
(used by the language's `Runtime` and by the tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable

import requests

from radixlm.errors import StartupRefusalError

REFUSAL_PREFIX = "radixlm: error: "  # cli.py's one error line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, timeout: float = 30) -> int | None:
    if proc.poll() is None:
        # SIGTERM lets uvicorn shut down and the server stop its scheduler and detokenizer.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _exit_error(name: str, code: int, output: str) -> RuntimeError:
    """Why a server exited before it was healthy: its refusal (exit code 2 after its one error
    line, as the command line refuses an option) or what it printed last."""
    lines = output.strip().splitlines()
    if code == 2 and lines and lines[-1].startswith(REFUSAL_PREFIX):
        return StartupRefusalError(lines[-1][len(REFUSAL_PREFIX) :])
    return RuntimeError(f"{name} exited ({code}): {output[-3000:]}")


class ServerProcess:
    """`python -m radixlm.cli serve --port <free> *args`, ready when /health answers 200.
    `command(port) -> argv` starts another HTTP server instead (e.g. llama-server)."""

    # What starts the command: subprocess.Popen, or a stand-in with its interface (the tests fork
    # their servers from a preloaded process: tests/forked_servers.py).
    popen: Callable[..., subprocess.Popen] = subprocess.Popen

    def __init__(
        self,
        *args: str,
        port: int | None = None,
        timeout: float = 180,
        command: Callable[[int], list] | None = None,
        name: str = "the radixlm server",
        cpus: list[int] | None = None,
        env: dict[str, str] | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "radixlm.cli",
            "serve",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *args,
        ]
        if command is not None:
            cmd = command(self.port)
        # A file, not a pipe: nobody reads the server's output while it runs, and a full pipe blocks
        # it.
        self.log = tempfile.TemporaryFile(mode="w+")
        # cpus: the cores the server may run on (its share under `serve --dp`; Linux only).
        pin = (
            (lambda: os.sched_setaffinity(0, cpus))
            if cpus and hasattr(os, "sched_setaffinity")
            else None
        )
        # env: added to this process's environment (keys go there: a command line is public in
        # `ps`).
        self.proc = type(self).popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=pin,
            env={**os.environ, **env} if env else None,
        )
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise _exit_error(name, self.proc.returncode, self.output())
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:  # not listening yet, or too busy to answer in 1 s
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(
            f"{name} did not become healthy in {timeout:.0f} s: {self.output()[-3000:]}"
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 30 s; returns the exit code."""
        code = _stop(self.proc)
        self._finalizer.detach()
        return code
