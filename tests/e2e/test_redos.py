"""Hostile stop conditions on a live server (tiny model): a stop_regex that backtracks
catastrophically on output forced by logit_bias must not stop other users' requests or /health,
and stop strings and patterns are bounded in number, length and compiled size (issue 35,
finding 1)."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests


@pytest.fixture
def server(tiny_server):
    """The run's shared tiny-model server (tests/conftest.py), its cache flushed."""
    return tiny_server


@pytest.fixture(scope="module")
def x_token(tiny_model_dir):
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    x = tok.convert_tokens_to_ids("x")
    assert tok.decode([x] * 3) == "xxx"
    return x


def _forced_x(x_token, pattern, max_new_tokens=200):
    # +100 on "x": every output token is "x", so the pattern is searched over "xxxx...".
    return {
        "text": "hello",
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "logit_bias": {str(x_token): 100},
            "stop_regex": pattern,
        },
    }


def test_catastrophic_stop_regex_does_not_freeze_other_requests(server, x_token):
    health: list[float] = []
    stop = threading.Event()

    def poll_health():
        while not stop.is_set():
            t = time.monotonic()
            try:
                ok = requests.get(server.url + "/health", timeout=2).status_code == 200
            except requests.RequestException:
                ok = False
            health.append(time.monotonic() - t if ok else float("inf"))
            time.sleep(0.2)

    def post(body, timeout=60):
        try:
            return requests.post(server.url + "/generate", json=body, timeout=timeout)
        except requests.RequestException as e:
            return e

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            # `re` backtracks exponentially on both (a frozen scheduler); the `regex` module sees
            # that the first one needs a "y" and fails it at once, the second still explodes.
            nested = pool.submit(post, _forced_x(x_token, "(x+x+)+y"))
            alternation = pool.submit(post, _forced_x(x_token, "(x|xx)+z"))
            time.sleep(1.0)  # both well past 30 "x"s
            t = time.monotonic()
            normal = post(
                {
                    "text": "hi",
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
                },
                timeout=30,
            )
            assert not isinstance(normal, Exception), (
                f"a normal request stalled behind a stop_regex: {normal}"
            )
            assert (
                normal.status_code == 200 and normal.json()["meta_info"]["completion_tokens"] == 16
            )
            assert time.monotonic() - t < 20
            r = alternation.result()
            assert r.status_code == 400, r.text
            assert "stop_regex" in r.json()["error"]["message"]
            r = nested.result()  # finished either way: no match, or stopped by its time budget
            assert r.status_code == 200 or (r.status_code == 400 and "stop_regex" in r.text), r.text
            if r.status_code == 200:
                assert (
                    r.json()["text"] == "x" * 200
                    and r.json()["meta_info"]["finish_reason"]["type"] == "length"
                )
    finally:
        stop.set()
        poller.join()
    assert health and max(health) < 2.0, f"/health took {max(health):.2f} s"
    # Streaming: the same timeout ends the stream with an error event naming the field.
    with requests.post(
        server.url + "/generate",
        json={**_forced_x(x_token, "(x|xx)+z"), "stream": True},
        stream=True,
        timeout=60,
    ) as r:
        events = [line for line in r.iter_lines() if line.startswith(b"data: ")]
    assert (
        b"stop_regex" in events[-2]
        and b'"code": 400' in events[-2]
        and events[-1] == b"data: [DONE]"
    )


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/generate", {"text": "a", "sampling_params": {"stop": ["s"] * 17}}, "stop"),
        ("/generate", {"text": "a", "sampling_params": {"stop": "s" * 257}}, "stop"),
        ("/generate", {"text": "a", "sampling_params": {"stop_regex": ["q"] * 17}}, "stop_regex"),
        ("/generate", {"text": "a", "sampling_params": {"stop_regex": "q" * 257}}, "stop_regex"),
        # Compiles to a million nodes in the regex module (seconds); ((x{65535}){65535}){65535} to
        # no end.
        (
            "/generate",
            {"text": "a", "sampling_params": {"stop_regex": "(?:a{1000}){1000}"}},
            "stop_regex",
        ),
        ("/v1/completions", {"prompt": "a", "stop": ["s"] * 17}, "stop"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "stop_regex": "q" * 257},
            "stop_regex",
        ),
    ],
)
def test_stop_conditions_are_bounded(server, path, body, field):
    r = requests.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert field in err["message"]
    if path != "/generate":
        assert err["param"] == field
    assert (
        requests.post(
            server.url + "/generate",
            json={
                "text": "a",
                "sampling_params": {
                    "max_new_tokens": 2,
                    "stop": ["s"] * 16,
                    "stop_regex": ["q" * 256] * 16,
                },
            },
            timeout=30,
        ).status_code
        == 200
    )
