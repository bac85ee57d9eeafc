"""Pipeline parallelism served: `radixlm serve --pp-size 2 --nnodes 2 --node-rank 0|1
--dist-init-addr`, one stage per "node" on localhost (node 1 runs no HTTP server). Through the
official openai client, streaming and not, and /generate, the outputs are PP=1's; killing the second
stage's process while a request runs answers that request with a 5xx and ends both nodes within 10
s, leaving no rank. A stage that hangs (SIGSTOP) is found by its heartbeat: the next request gets a
5xx within 10 s and the server exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import openai
import psutil
import requests

from radixlm.server.process import ServerProcess, free_port
from tests.server_faults import engine_processes

PROMPTS = ["The capital of France is", "def fib(n):", "One, two, three,"]
GREEDY = {"max_new_tokens": 16, "temperature": 0}


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _rank_of(node_pid: int) -> psutil.Process:
    """The one rank a node > 0 runs."""
    (rank,) = engine_processes(node_pid)
    return rank


def test_pp2_two_nodes_openai_then_kill_a_stage(tiny_model_dir, tiny_engine):
    want = tiny_engine.generate(PROMPTS, GREEDY)  # PP=1's: the session's plain engine
    addr = f"127.0.0.1:{free_port()}"
    common = [
        "--model-path",
        tiny_model_dir,
        "--pp-size",
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
        r = requests.post(
            node0.url + "/generate", json={"text": PROMPTS, "sampling_params": GREEDY}, timeout=120
        )
        assert r.status_code == 200, r.text
        assert [o["output_ids"] for o in r.json()] == [o["output_ids"] for o in want]
        client = openai.OpenAI(base_url=node0.url + "/v1", api_key="x", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        whole = client.completions.create(
            model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0
        )
        chunks = client.completions.create(
            model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True
        )
        assert (
            whole.choices[0].text == "".join(c.choices[0].text for c in chunks) == want[0]["text"]
        )
        info = requests.get(node0.url + "/get_server_info", timeout=10).json()
        assert info["pp_size"] == 2

        # A long request in flight, then the second stage's process dies.
        stage0, stage1 = psutil.Process(info["scheduler_pid"]), _rank_of(node1.pid)
        procs = [*psutil.Process(node0.proc.pid).children(recursive=True), stage1]
        answer: dict = {}

        def long_request():
            body = {
                "text": "Go on:",
                "sampling_params": {"max_new_tokens": 1000, "temperature": 0, "ignore_eos": True},
            }
            answer["status"] = requests.post(
                node0.url + "/generate", json=body, timeout=60
            ).status_code

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)
        assert "status" not in answer, "the request finished before the stage was killed"
        t0 = time.monotonic()
        os.kill(stage1.pid, signal.SIGKILL)
        t.join(timeout=10)
        assert 500 <= answer.get("status", 0) < 600, answer
        while _alive([stage0]) and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert _alive([stage0]) == [], "the first stage outlived the second by 10 s"
        # Then the servers of both nodes exit (node 0 after --engine-failure-exit-delay), leaving
        # nothing.
        assert node0.proc.wait(timeout=20) != 0 and node1.wait(timeout=20) != 0
        psutil.wait_procs(procs, timeout=5)
        assert _alive(procs) == []
        assert "scheduler rank 0 process died" in node0.output(), node0.output()[-2000:]
    finally:
        if node1.poll() is None:
            node1.kill()
        log1.seek(0)
        print(log1.read()[-2000:])


def test_pp2_hung_stage_stops_the_server(tiny_model_dir):
    server = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--pp-size",
        "2",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
    )
    try:
        r = requests.post(
            server.url + "/generate", json={"text": PROMPTS, "sampling_params": GREEDY}, timeout=120
        )
        assert r.status_code == 200, r.text
        info = requests.get(server.url + "/get_server_info", timeout=10).json()
        children = psutil.Process(server.proc.pid).children(recursive=True)
        (stage1,) = [
            p
            for p in engine_processes(server.proc.pid)
            if p.pid not in (info["scheduler_pid"], info["detokenizer_pid"])
        ]
        t0 = time.monotonic()
        os.kill(stage1.pid, signal.SIGSTOP)
        r = requests.post(
            server.url + "/generate",
            json={"text": PROMPTS[0], "sampling_params": GREEDY},
            timeout=30,
        )
        assert 500 <= r.status_code < 600 and time.monotonic() - t0 < 10, (
            r.status_code,
            time.monotonic() - t0,
        )
        assert server.proc.wait(timeout=20) != 0
        psutil.wait_procs(children, timeout=5)
        assert _alive(children) == []
        assert (
            "scheduler rank 1 process" in server.output()
            and "hung: no heartbeat" in server.output()
        )
    finally:
        server.stop()
