"""Faults on a live server (tiny model): an engine process killed (exit non-zero, or restarted with
--restart-on-failure), and SIGTERM draining in-flight requests for --graceful-shutdown-timeout."""

import json
import os
import signal
import threading
import time

import psutil
import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.server_faults import health_status, stop_leaving_nothing, stream_events, wait_until

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def _body(max_new_tokens=900, **kw):
    return {
        "text": "hello there",
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, **kw},
    }


@pytest.mark.parametrize("victim", ["scheduler", "detokenizer"])
def test_engine_process_killed_health_503_requests_fail_fast_server_exits_1(tiny_model_dir, victim):
    s = ServerProcess("--model-path", tiny_model_dir, *TINY)
    kids = psutil.Process(s.proc.pid).children(recursive=True)
    try:
        info = requests.get(s.url + "/get_server_info", timeout=10).json()
        pid = info["scheduler_pid" if victim == "scheduler" else "detokenizer_pid"]
        plain, stream = {}, {}

        def inflight():
            try:
                plain["r"] = requests.post(s.url + "/generate", json=_body(), timeout=120)
            except requests.RequestException as e:
                plain["r"] = e
            plain["ended"] = time.monotonic()

        threads = [
            threading.Thread(target=inflight),
            threading.Thread(target=stream_events, args=(s.url, _body(), stream)),
        ]
        for t in threads:
            t.start()
        assert wait_until(lambda: stream.get("started"), 30)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: health_status(s.url) == 503, 2.0), (
            "/health did not turn 503 within 2 s"
        )
        health_503_after = time.monotonic() - killed
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads), (
            "an in-flight request hung after the engine died"
        )
        r = plain["r"]
        assert isinstance(r, requests.Response) and r.status_code == 503
        assert f"the {victim} process died" in r.json()["error"]["message"]
        assert plain["ended"] - killed < 2.0 and stream["ended"] - killed < 2.0
        last = json.loads(stream["events"][-2])  # the error event, then [DONE]
        assert stream["events"][-1] == "[DONE]" and last["error"]["code"] == 503
        # Then the launcher exits non-zero, says why, and leaves no process behind.
        assert s.proc.wait(timeout=30) == 1
        assert f"radixlm: error: the {victim} process died" in s.output()
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive
        print(f"{victim} killed: /health 503 after {health_503_after:.2f} s")
    finally:
        s.stop()


def test_restart_on_failure_serves_again_with_the_same_outputs(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, "--restart-on-failure", *TINY)
    try:
        greedy = {"text": "The same question", "sampling_params": GREEDY}
        before = requests.post(s.url + "/generate", json=greedy, timeout=60).json()
        info = requests.get(s.url + "/get_server_info", timeout=10).json()
        old = [psutil.Process(info["scheduler_pid"]), psutil.Process(info["detokenizer_pid"])]
        result = {}
        t = threading.Thread(target=stream_events, args=(s.url, _body(), result))
        t.start()
        assert wait_until(lambda: result.get("started"), 30)
        old[0].kill()
        t.join(timeout=10)
        assert not t.is_alive() and json.loads(result["events"][-2])["error"]["code"] == 503
        assert wait_until(lambda: health_status(s.url) == 200, 120, 0.2), (
            "the engine did not come back"
        )
        after = requests.post(s.url + "/generate", json=greedy, timeout=60).json()
        assert after["output_ids"] == before["output_ids"] and after["text"] == before["text"]
        info2 = requests.get(s.url + "/get_server_info", timeout=10).json()
        assert info2["engine_restarts"] == 1 and info2["scheduler_pid"] != info["scheduler_pid"]
        _, alive = psutil.wait_procs(old, timeout=15)  # the old engine's survivor was stopped
        assert not alive
        assert s.proc.poll() is None
    finally:
        stop_leaving_nothing(s)


def test_sigterm_drains_in_flight_requests_then_stops_everything(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, *TINY)
    kids = psutil.Process(s.proc.pid).children(recursive=True)
    result = {}
    t = threading.Thread(target=stream_events, args=(s.url, _body(600), result))
    t.start()
    assert wait_until(lambda: result.get("started"), 30)
    s.proc.send_signal(signal.SIGTERM)
    # New connections are refused at once while the in-flight stream goes on to its end.
    assert wait_until(lambda: health_status(s.url) is None, 5)
    t.join(timeout=60)
    assert result["status"] == 200 and result["events"][-1] == "[DONE]"
    final = json.loads(result["events"][-2])
    assert (
        final["meta_info"]["finish_reason"]["type"] == "length" and len(final["output_ids"]) == 600
    )
    s.proc.wait(timeout=30)
    _, alive = psutil.wait_procs(kids, timeout=15)
    assert not alive


def test_sigterm_stops_after_graceful_shutdown_timeout(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, "--graceful-shutdown-timeout", "1", *TINY)
    kids = psutil.Process(s.proc.pid).children(recursive=True)
    result = {}
    # Far more work than one second: 32 streams of 900 tokens on one thread.
    body = {**_body(), "sampling_params": {**_body()["sampling_params"], "n": 32}}
    t = threading.Thread(target=stream_events, args=(s.url, body, result))
    t.start()
    assert wait_until(lambda: result.get("started"), 30)
    sent = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=30)
    stopped_after = time.monotonic() - sent
    t.join(timeout=30)
    assert not t.is_alive()
    finished = [
        e
        for e in result.get("events", [])
        if e != "[DONE]" and json.loads(e)["meta_info"]["finish_reason"]
    ]
    assert len(finished) < 32, "the whole batch finished: the drain was not cut"
    assert stopped_after < 1 + 10
    _, alive = psutil.wait_procs(kids, timeout=15)
    assert not alive
    print(f"SIGTERM with --graceful-shutdown-timeout 1: stopped after {stopped_after:.2f} s")
