"""Issue 35, finding 9, through HTTP: `cached_tokens` must not let one client probe another's prompt
(vLLM's `cache_salt` puts a request's KV in a namespace of its own, on /generate and the OpenAI
routes), and a client's `priority` counts only with --enable-priority-scheduling (SGLang's flag)."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from radixlm.server.process import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
P = [1000 + 13 * i for i in range(40)]


@pytest.fixture
def tiny(tiny_server):
    """The run's shared tiny-model server (tests/conftest.py), its cache flushed: the salts' zeros
    below are this test's own."""
    return tiny_server


def cached(url: str, ids: list[int], salt=None) -> int:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    if salt is not None:
        body["cache_salt"] = salt
    r = requests.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]["cached_tokens"]


def test_cache_salt_isolates_prefixes_on_generate(tiny):
    url = tiny.url
    assert cached(url, P, "alice") == 0
    assert cached(url, P, "bob") == 0  # another salt shares nothing
    assert cached(url, P) == 0  # nor does the common namespace
    assert cached(url, P, "alice") == len(P) - 1  # the same salt does
    assert cached(url, P) == len(P) - 1
    # The probe: a prefix of alice's prompt plus a guess, under another salt, learns nothing.
    assert cached(url, P[:30] + [7] * 10, "mallory") == 0
    assert cached(url, P[:30] + [7] * 10, "alice") == 30
    # A batch with one salt per item.
    r = requests.post(
        url + "/generate",
        timeout=60,
        json={
            "input_ids": [P, P],
            "cache_salt": ["alice", "carol"],
            "sampling_params": {"max_new_tokens": 1},
        },
    )
    assert r.status_code == 200, r.text
    assert [o["meta_info"]["cached_tokens"] for o in r.json()] == [len(P) - 1, 0]


@pytest.mark.parametrize("salt", ["", 5, ["a"], "x" * 1025])
def test_bad_cache_salt_is_a_400(tiny, salt):
    r = requests.post(tiny.url + "/generate", json={"input_ids": P, "cache_salt": salt}, timeout=30)
    assert r.status_code == 400, r.text
    assert "cache_salt" in r.text


def test_cache_salt_on_the_openai_routes(tiny):
    url = tiny.url
    ids = [2000 + 7 * i for i in range(30)]

    def completion(salt):
        r = requests.post(
            url + "/v1/completions",
            timeout=60,
            json={"prompt": ids, "max_tokens": 1, "cache_salt": salt},
        )
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert completion("dave") == 0
    assert completion("erin") == 0
    assert completion("dave") == len(ids) - 1

    msgs = [{"role": "user", "content": "Tell me about the tenant's lease number 4711 in detail."}]

    def chat(salt):
        r = requests.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={"messages": msgs, "max_tokens": 1, "cache_salt": salt},
        )
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert chat("frank") == 0
    assert chat("grace") == 0
    assert chat("frank") > 10
    r = requests.post(
        url + "/v1/chat/completions", json={"messages": msgs, "cache_salt": ""}, timeout=30
    )
    assert r.status_code == 400 and "cache_salt" in r.text


def _admission_order(url: str) -> list[str]:
    """One long request runs alone (--max-running-requests 1) while "low" (priority 0) and then
    "high" (priority 10) queue behind it; the order in which those two finish."""
    done: list[str] = []

    def send(name: str, priority: int, n: int) -> None:
        r = requests.post(
            url + "/generate",
            timeout=300,
            json={
                "input_ids": [5, 6, 7, 8],
                "priority": priority,
                "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0},
            },
        )
        assert r.status_code == 200, r.text
        done.append(name)

    def state() -> dict:
        return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"]

    def wait(pred) -> None:
        deadline = time.time() + 60
        while not pred(state()):
            assert time.time() < deadline
            time.sleep(0.02)

    threads = [threading.Thread(target=send, args=("long", 0, 600))]
    threads[0].start()
    wait(lambda s: s["num_running"] == 1)
    for name, prio, waiting in (("low", 0, 1), ("high", 10, 2)):
        # 48 tokens: the second request's answer ends well after the first's, so the order in which
        # the client threads see them is the server's even on a loaded machine (4 tokens was ~10 ms
        # apart).
        threads.append(threading.Thread(target=send, args=(name, prio, 48)))
        threads[-1].start()
        wait(lambda s, w=waiting: s["num_waiting"] == w)
    assert state()["num_running"] == 1, "the long request ended before both queued: make it longer"
    for t in threads:
        t.join()
    return [n for n in done if n != "long"]


@pytest.mark.parametrize("flag", [False, True])
def test_priority_counts_only_with_the_flag(tiny_model_dir, flag):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        *TINY,
        "--max-running-requests",
        "1",
        "--schedule-policy",
        "fcfs",
        *(["--enable-priority-scheduling"] if flag else []),
    )
    try:
        assert _admission_order(s.url) == (["high", "low"] if flag else ["low", "high"])
    finally:
        s.stop()
