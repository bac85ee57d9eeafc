"""Two "nodes" on localhost: `radixlm serve --tp 2 --nnodes 2 --node-rank 0|1 --dist-init-addr`, one
rank each; node 1 runs no HTTP server. Their outputs are TP=1's; killing node 1's process ends
both nodes within 10 s with one message, and leaves no rank behind. A rank that hangs (SIGSTOP)
brings a single-node server down the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import requests

from radixlm.server.process import ServerProcess, free_port
from tests.server_faults import engine_processes

PROMPTS = ["The capital of France is", "def fib(n):", "One, two, three,"]
GREEDY = {"max_new_tokens": 16, "temperature": 0}


def _generate(url: str) -> list[list[int]]:
    r = requests.post(
        url + "/generate", json={"text": PROMPTS, "sampling_params": GREEDY}, timeout=120
    )
    assert r.status_code == 200, r.text
    return [o["output_ids"] for o in r.json()]


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _wait_gone(procs: list[psutil.Process], deadline: float) -> list[psutil.Process]:
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_two_nodes_on_localhost_then_kill_one(tiny_model_dir, tiny_engine):
    # TP=1's: the session's plain engine (tests/conftest.py)
    want = [o["output_ids"] for o in tiny_engine.generate(PROMPTS, GREEDY)]
    addr = f"127.0.0.1:{free_port()}"
    common = [
        "--model-path",
        tiny_model_dir,
        "--tp-size",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        addr,
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
    ]
    log1 = tempfile.TemporaryFile(mode="w+")
    node1 = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixlm.cli",
            "serve",
            *common,
            "--node-rank",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=log1,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        node0 = ServerProcess(*common, "--node-rank", "0")
        assert _generate(node0.url) == want
        info = requests.get(node0.url + "/get_server_info", timeout=10).json()
        assert info["tp_size"] == 2
        ranks = _descendants(node0.proc.pid) + _descendants(node1.pid)
        assert (
            len(engine_processes(node0.proc.pid) + engine_processes(node1.pid)) >= 3
        )  # 2 ranks + detokenizer
        t0 = time.monotonic()
        os.kill(node1.pid, signal.SIGKILL)
        code = node0.proc.wait(timeout=10)
        node1.wait(timeout=5)
        assert time.monotonic() - t0 < 10
        assert code != 0
        assert _wait_gone(ranks, t0 + 10) == []
        out = node0.output()
        assert "scheduler rank 0 process died" in out, out[-2000:]
    finally:
        if node1.poll() is None:
            node1.kill()
        log1.seek(0)
        print(log1.read()[-2000:])


def test_hung_rank_stops_the_server(tiny_model_dir):
    server = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--tp",
        "2",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
    )
    try:
        assert len(_generate(server.url)) == len(PROMPTS)
        children = _descendants(server.proc.pid)
        info = requests.get(server.url + "/get_server_info", timeout=10).json()
        known = {
            info["scheduler_pid"],
            info["detokenizer_pid"],
        }  # rank 0, the detokenizer; the other child is rank 1
        (target,) = [p for p in engine_processes(server.proc.pid) if p.pid not in known]
        t0 = time.monotonic()
        os.kill(target.pid, signal.SIGSTOP)
        code = server.proc.wait(timeout=15)
        assert time.monotonic() - t0 < 10 and code != 0
        assert _wait_gone(children, t0 + 10) == []
        assert (
            "scheduler rank 1 process" in server.output()
            and "hung: no heartbeat" in server.output()
        )
    finally:
        server.stop()
