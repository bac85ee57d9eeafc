"""Serving behaviour on a tiny model: API key, queue limit, process lifecycle, metrics (faults:
test_faults.py)."""

import signal
import threading
import time

import psutil
import requests

from tests.e2e.conftest import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")


def gen(url, headers=None, **sp):
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 2, **sp}}
    return requests.post(url + "/generate", json=body, headers=headers or {}, timeout=60)


def test_api_key(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, "--api-key", "sekret", *TINY)
    try:
        assert gen(s.url).status_code == 401
        r = gen(s.url, {"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert (
            requests.get(s.url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code
            == 401
        )
        assert gen(s.url, {"Authorization": "Bearer sekret"}).status_code == 200
        assert requests.get(s.url + "/health").status_code == 200  # liveness needs no key
    finally:
        s.stop()


def test_queue_limit_429_then_serves_again(tiny_model_dir):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
        *TINY,
    )
    try:
        results = {}

        def long(i):
            results[i] = gen(s.url, max_new_tokens=1000, ignore_eos=True).status_code

        threads = [threading.Thread(target=long, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.2)
        r = gen(s.url)
        assert r.status_code == 429 and "queued" in r.json()["error"]["message"]
        for t in threads:
            t.join()
        assert results == {0: 200, 1: 200}
        assert gen(s.url).status_code == 200
    finally:
        s.stop()


def test_metrics(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, "--enable-metrics", *TINY)
    try:
        prefix = "the same long prefix " * 20
        for q in ("a?", "b?"):
            requests.post(
                s.url + "/generate",
                json={"text": prefix + q, "sampling_params": {"max_new_tokens": 3}},
                timeout=60,
            )
        text = requests.get(s.url + "/metrics").text

        def value(name):
            for line in text.splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
            raise AssertionError(f"{name} missing from /metrics")

        assert value("radixlm:prompt_tokens_total") > 2 * 40
        assert value("radixlm:generation_tokens_total") == 6
        assert value("radixlm:cached_tokens_total") >= 40
        assert value("radixlm:time_to_first_token_seconds_count") == 2
        assert value("radixlm:e2e_request_latency_seconds_count") == 2
        assert value("radixlm:inter_token_latency_seconds_count") == 2
        assert value("radixlm:num_running_reqs") == 0 and value("radixlm:token_usage") == 0
        assert 0 < value("radixlm:cache_hit_rate") < 1
    finally:
        s.stop()


def test_start_stop_ten_times_leaves_no_process(tiny_model_dir):
    for i in range(10):
        s = ServerProcess("--model-path", tiny_model_dir, *TINY)
        kids = psutil.Process(s.proc.pid).children(recursive=True)
        assert len(kids) >= 2
        if i % 2:
            s.proc.send_signal(signal.SIGINT)
            s.proc.wait(timeout=30)
        else:
            s.stop()  # SIGTERM
        gone, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, f"round {i}: {[p.pid for p in alive]} still running"


def test_speculative_stats_over_http(tiny_model_dir):
    """A prompt sent twice with radix drafts: the second answer is the first (greedy), drafted
    from the tree and accepted; meta_info, /get_server_info and /metrics agree on the counts."""
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--enable-metrics",
        "--speculative-algorithm",
        "radix",
        *TINY,
    )
    try:
        body = {
            "input_ids": list(range(300, 340)),
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
        }
        first, second = (
            requests.post(s.url + "/generate", json=body, timeout=60).json() for _ in range(2)
        )
        assert second["output_ids"] == first["output_ids"]
        m1, m2 = first["meta_info"], second["meta_info"]
        assert (
            m1["spec_accepted_tokens"] == 0
            and m2["spec_accepted_tokens"] > 0
            and m2["spec_verify_ct"] > 0
        )
        st = requests.get(s.url + "/get_server_info", timeout=10).json()["internal_state"]
        assert st["spec_accepted_tokens"] == m2["spec_accepted_tokens"]
        assert st["spec_accept_length"] == round(
            (st["spec_accepted_tokens"] + m2["spec_verify_ct"]) / m2["spec_verify_ct"], 3
        )
        text = requests.get(s.url + "/metrics").text
        metric = {
            ln.split(" ")[0]: float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines()
            if ln.startswith("radixlm:spec")
        }
        assert metric["radixlm:spec_accepted_tokens_total"] == m2["spec_accepted_tokens"]
        assert metric["radixlm:spec_verify_steps_total"] == m2["spec_verify_ct"]
        assert metric["radixlm:spec_accept_length"] == st["spec_accept_length"] > 1
    finally:
        s.stop()
