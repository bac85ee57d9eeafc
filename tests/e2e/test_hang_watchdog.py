"""A hung scheduler (SIGSTOP: the process is there, its loop makes no progress) is found by its loop
heartbeat (--watchdog-timeout): /health turns 503, in-flight requests fail with a 503, and the
server exits non-zero or (--restart-on-failure) starts a new engine. An idle stopped scheduler is
not hung (nothing waits on it) until a request comes."""

import json
import os
import signal
import threading
import time

import psutil
import requests

from radixlm.server.process import ServerProcess
from tests.server_faults import health_status, stop_leaving_nothing, stream_events, wait_until

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
TIMEOUT = 2.0  # --watchdog-timeout
INTERVAL = 0.5  # --watchdog-interval (the default)
SLACK = 2.5  # a loaded 2-core machine: the watchdog thread's tick and the HTTP round trip
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
LONG = {"text": "hello there", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}


def _plain(url, out: dict):
    try:
        out["r"] = requests.post(
            url + "/generate", json={"text": "hi", "sampling_params": GREEDY}, timeout=120
        )
    except requests.RequestException as e:
        out["r"] = e


def test_hung_scheduler_health_503_requests_fail_server_exits_1(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, "--watchdog-timeout", str(TIMEOUT), *TINY)
    kids = psutil.Process(s.proc.pid).children(recursive=True)
    sched = None
    try:
        sched = requests.get(s.url + "/get_server_info", timeout=10).json()["scheduler_pid"]
        os.kill(sched, signal.SIGSTOP)
        # Idle: nothing waits on the scheduler, so it is not hung (yet).
        time.sleep(TIMEOUT + 2 * INTERVAL)
        assert health_status(s.url) == 200
        plain, stream = {}, {}
        threads = [
            threading.Thread(target=_plain, args=(s.url, plain)),
            threading.Thread(target=stream_events, args=(s.url, LONG, stream)),
        ]
        sent = time.monotonic()
        for t in threads:
            t.start()
        assert wait_until(lambda: health_status(s.url) == 503, TIMEOUT + INTERVAL + SLACK), (
            "/health did not turn 503"
        )
        health_503_after = time.monotonic() - sent
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads), "an in-flight request hung"
        r = plain["r"]
        assert isinstance(r, requests.Response) and r.status_code == 503, r
        assert (
            "the scheduler process" in r.json()["error"]["message"]
            and "hung" in r.json()["error"]["message"]
        )
        assert stream["status"] == 200 and stream["events"][-1] == "[DONE]"
        assert json.loads(stream["events"][-2])["error"]["code"] == 503
        # Then the server exits non-zero, says why, and leaves no process behind (the stopped one
        # killed).
        assert s.proc.wait(timeout=30) == 1
        assert "radixlm: error: the scheduler process" in s.output() and "hung" in s.output()
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive
        print(f"scheduler stopped: /health 503 {health_503_after:.2f} s after the request came")
    finally:
        if sched is not None and psutil.pid_exists(sched):
            os.kill(sched, signal.SIGCONT)
        s.stop()


def test_hung_scheduler_restart_on_failure_serves_again_with_the_same_outputs(tiny_model_dir):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--watchdog-timeout",
        str(TIMEOUT),
        "--restart-on-failure",
        *TINY,
    )
    try:
        greedy = {"text": "The same question", "sampling_params": GREEDY}
        before = requests.post(s.url + "/generate", json=greedy, timeout=60).json()
        info = requests.get(s.url + "/get_server_info", timeout=10).json()
        old = [psutil.Process(info["scheduler_pid"]), psutil.Process(info["detokenizer_pid"])]
        stream = {}
        t = threading.Thread(target=stream_events, args=(s.url, LONG, stream))
        t.start()
        assert wait_until(lambda: stream.get("started"), 30)
        old[0].suspend()  # SIGSTOP mid-stream
        stopped = time.monotonic()
        assert wait_until(lambda: health_status(s.url) == 503, TIMEOUT + INTERVAL + SLACK), (
            "/health did not turn 503"
        )
        print(f"scheduler stopped mid-stream: /health 503 after {time.monotonic() - stopped:.2f} s")
        t.join(timeout=10)
        assert not t.is_alive() and json.loads(stream["events"][-2])["error"]["code"] == 503
        assert wait_until(lambda: health_status(s.url) == 200, 120, 0.2), (
            "the engine did not come back"
        )
        after = requests.post(s.url + "/generate", json=greedy, timeout=60).json()
        assert after["output_ids"] == before["output_ids"] and after["text"] == before["text"]
        info2 = requests.get(s.url + "/get_server_info", timeout=10).json()
        assert info2["engine_restarts"] == 1 and info2["scheduler_pid"] != info["scheduler_pid"]
        _, alive = psutil.wait_procs(
            old, timeout=15
        )  # the hung scheduler killed, the old detokenizer stopped
        assert not alive
        assert s.proc.poll() is None
    finally:
        stop_leaving_nothing(s)


def test_a_frozen_tp_rank_turns_health_503_and_the_group_exits(tiny_model_dir):
    """One rank of a TP group frozen (SIGSTOP: a stuck collective, a kernel that never returns):
    a request then waits on rank 0, whose loop blocks on the frozen peer; within the watchdog
    timeout /health answers 503 (a gateway routes away), the request fails with a 503, and the
    whole process group exits non-zero with no rank left behind."""
    s = ServerProcess(
        "--model-path", tiny_model_dir, "--tp-size", "2", "--watchdog-timeout", str(TIMEOUT), *TINY
    )
    kids = psutil.Process(s.proc.pid).children(recursive=True)
    rank1 = None
    try:
        rank0 = requests.get(s.url + "/get_server_info", timeout=10).json()["scheduler_pid"]
        ranks = [p for p in kids if p.name().startswith("scheduler") and p.pid != rank0]
        assert len(ranks) == 1, [(p.pid, p.name()) for p in kids]
        rank1 = ranks[0].pid
        out = {}
        _plain(s.url, out)  # the group serves first
        assert out["r"].status_code == 200, out["r"]
        os.kill(rank1, signal.SIGSTOP)
        plain = {}
        thread = threading.Thread(target=_plain, args=(s.url, plain))
        sent = time.monotonic()
        thread.start()
        assert wait_until(lambda: health_status(s.url) == 503, TIMEOUT + INTERVAL + SLACK), (
            "/health did not turn 503"
        )
        health_503_after = time.monotonic() - sent
        thread.join(timeout=10)
        assert not thread.is_alive(), "the in-flight request hung"
        r = plain["r"]
        assert isinstance(r, requests.Response) and r.status_code == 503, r
        assert s.proc.wait(timeout=30) == 1
        # rank 0 is the one whose loop stalled (blocked on its frozen peer)
        assert "radixlm: error: the scheduler rank 0 process" in s.output()
        assert "hung" in s.output()
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, [p.pid for p in alive]
        print(f"TP rank 1 frozen: /health 503 {health_503_after:.2f} s after the request came")
    finally:
        if rank1 is not None and psutil.pid_exists(rank1):
            os.kill(rank1, signal.SIGCONT)
        s.stop()
