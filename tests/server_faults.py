"""Helpers of the tests that break a live server (test_faults, test_hang_watchdog, test_tp_serving):
waiting for a condition with a bound, /health's status, a stream's events kept as they come,
stopping a server and checking that none of its processes is left, its engine's processes."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil
import requests


def wait_until(pred: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """True as soon as pred() is truthy, False when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def health_status(url: str) -> int | None:
    """/health's status, or None when the server does not answer within a second."""
    try:
        return requests.get(url + "/health", timeout=1).status_code
    except requests.RequestException:
        return None


def engine_processes(pid: int) -> list[psutil.Process]:
    """The processes running the engine of a server (or of a `serve --node-rank K` node): its
    scheduler ranks and detokenizer, by the names they give themselves (process_context.run_child).
    Not multiprocessing's helpers, which outlive an engine that restarts: the resource tracker, and
    the fork server the engine's children may fork from (radixlm/engine/process_context.py)."""
    return [
        p
        for p in psutil.Process(pid).children(recursive=True)
        if p.name().startswith("scheduler") or p.name() == "detokenizer"
    ]


def stop_leaving_nothing(server, timeout: float = 15) -> None:
    """Stop a ServerProcess and assert that every process under it ended."""
    kids = psutil.Process(server.proc.pid).children(recursive=True)
    server.stop()
    _, alive = psutil.wait_procs(kids, timeout=timeout)
    assert not alive, alive


def stream_events(url: str, body: dict, out: dict) -> None:
    """Stream /generate's `body`: out["status"], every event in out["events"], out["started"] at the
    first, out["error"] on a transport error, out["ended"] (time.monotonic()) when it ends."""
    try:
        with requests.post(
            url + "/generate", json={**body, "stream": True}, stream=True, timeout=120
        ) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    out.setdefault("events", []).append(line[6:].decode())
                    out["started"] = True
    except requests.RequestException as e:
        out["error"] = e
    out["ended"] = time.monotonic()
