"""Fan-out and the tokenizer's work on a live server (tiny model; issue 35, finding 6): a request's
prompts x n are bounded (--max-client-batch-size) and counted against the queue
(--max-queued-requests) before they are expanded; /tokenize is bounded by the context length;
chat_template_kwargs cannot set the template or its reserved inputs; templating and
tokenization run off the event loop, under --tokenizer-timeout."""

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from radixlm.server.process import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
# spin**3 loop turns in Jinja: spin 600 is seconds of CPU (7 s here), on whichever thread renders
# it.
_LOOP = "{% for _ in range(spin|default(0)) %}"
SPIN = _LOOP * 3 + "{% endfor %}" * 3


@pytest.fixture
def server(tiny_server):
    """The run's shared tiny-model server (tests/conftest.py), its cache flushed."""
    return tiny_server


def _post(url, path, body, timeout=60):
    return requests.post(url + path, json=body, timeout=timeout)


class _HealthPoller:
    """/health's answer times, every 0.2 s, while the block runs (inf: no 200 within 2 s)."""

    def __init__(self, url):
        self.url, self.times, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                ok = requests.get(self.url + "/health", timeout=2).status_code == 200
            except requests.RequestException:
                ok = False
            self.times.append(time.monotonic() - t if ok else float("inf"))
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        assert self.times and max(self.times) < 2.0, f"/health took {max(self.times):.2f} s"


def test_batch_times_n_is_bounded_before_expansion(server):
    sp = {"max_new_tokens": 1, "n": 2}
    r = _post(server.url, "/generate", {"input_ids": [[5, 6]] * 513, "sampling_params": sp})
    assert r.status_code == 400, r.status_code
    err = r.json()["error"]
    assert (
        err["param"] == "input_ids"
        and "1026 sequences" in err["message"]
        and "--max-client-batch-size" in err["message"]
    )
    # Per-item sampling_params count each item's n.
    r = _post(server.url, "/generate", {"text": ["a"] * 10, "sampling_params": [{"n": 128}] * 10})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"
    r = _post(server.url, "/v1/completions", {"prompt": ["a"] * 300, "n": 4, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # Within the bound: served.
    r = _post(server.url, "/generate", {"input_ids": [[5, 6]] * 8, "sampling_params": sp})
    assert r.status_code == 200 and len(r.json()) == 16


def test_tokenize_is_bounded_by_the_context(server):
    ctx = requests.get(server.url + "/get_model_info", timeout=10).json()["context_length"]
    r = _post(server.url, "/tokenize", {"text": "hello " * ctx})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text", r.text
    t = time.monotonic()
    r = _post(server.url, "/tokenize", {"text": "x" * 20_000_000})  # refused before tokenizing it
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"
    assert time.monotonic() - t < 10
    r = _post(server.url, "/tokenize", {"text": ["a"] * 1025})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"
    r = _post(server.url, "/detokenize", {"tokens": [5] * (ctx + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = _post(server.url, "/tokenize", {"text": "hello world"})
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 0
    assert (
        _post(server.url, "/detokenize", {"tokens": r.json()["tokens"]}).json()["text"]
        == "hello world"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {
            "chat_template": SPIN + "{{ messages[0]['content'] }}",
            "spin": 600,
        },  # the client's own template
        {"tools": [{"type": "function", "function": {"name": "f"}}]},  # around tools' own check
        {"tokenize": True},
        {"messages": []},
    ],
)
def test_chat_template_kwargs_cannot_set_reserved_keys(server, kwargs):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "chat_template_kwargs": kwargs,
    }
    with _HealthPoller(server.url):
        r = _post(server.url, "/v1/chat/completions", body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        err["param"] == "chat_template_kwargs"
        and next(k for k in kwargs if k != "spin") in err["message"]
    )
    ok = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    assert _post(server.url, "/v1/chat/completions", ok).status_code == 200


def test_expanded_requests_count_against_the_queue(tiny_model_dir):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "4",
        *TINY,
    )
    try:
        # Could never fit (4 queued + 1 running): a 400, not a 429 to retry.
        r = _post(
            s.url,
            "/generate",
            {"text": ["a", "b", "c"], "sampling_params": {"n": 2, "max_new_tokens": 1}},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "text", r.text
        with ThreadPoolExecutor(8) as pool:
            # Runs for seconds: the only running slot stays taken while the calls below are
            # answered.
            long = pool.submit(
                _post,
                s.url,
                "/generate",
                {"text": "hi", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}},
                120,
            )
            deadline = time.monotonic() + 30
            while (
                requests.get(s.url + "/get_server_info", timeout=10).json()["num_tracked_requests"]
                < 1
            ):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            # 5 sequences behind the running one: past the 4 the queue holds.
            r = _post(
                s.url, "/v1/completions", {"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 1}
            )
            assert r.status_code == 429, r.text
            # Concurrent calls of 3 sequences each: only one fits, however their tokenization
            # interleaves.
            burst = [
                pool.submit(
                    _post,
                    s.url,
                    "/generate",
                    {"text": ["x " * 200 + str(i)] * 3, "sampling_params": {"max_new_tokens": 1}},
                    120,
                )
                for i in range(6)
            ]
            codes = sorted(f.result().status_code for f in burst)
            assert codes == [200] + [429] * 5, codes
            assert long.result().status_code == 200
    finally:
        s.stop()


def test_templating_runs_off_the_event_loop_under_a_time_bound(tiny_model_dir, tmp_path):
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = SPIN + tok.chat_template  # the server's own template, made slow by a kwarg
    tok.save_pretrained(tmp_path)
    shutil.copy(
        os.path.join(tiny_model_dir, "config.json"), tmp_path
    )  # what a tokenizer directory is told by
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--tokenizer-path",
        str(tmp_path),
        "--tokenizer-timeout",
        "1",
        *TINY,
    )
    try:
        slow = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "chat_template_kwargs": {"spin": 600},
        }
        with _HealthPoller(s.url), ThreadPoolExecutor(2) as pool:
            f = pool.submit(_post, s.url, "/v1/chat/completions", slow, 60)
            time.sleep(0.3)
            t = time.monotonic()
            r = _post(
                s.url, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}}, 30
            )
            assert r.status_code == 200 and time.monotonic() - t < 5
            r = f.result()
        assert r.status_code == 504 and "--tokenizer-timeout" in r.json()["error"]["message"], (
            r.text
        )
        fast = {**slow, "chat_template_kwargs": {"spin": 1}}
        assert _post(s.url, "/v1/chat/completions", fast).status_code == 200
    finally:
        s.stop()
