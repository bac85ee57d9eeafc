"""An internal failure of one request reaches its client as a 5xx (or, once a stream started, an
error event) with a generic message and the request id, never the exception text; the details
are in the server log, and the server goes on serving.

The failure is a real one: the scheduler loads the tokenizer lazily, at the first request that
needs it (stop strings); the model directory's tokenizer files are gone by then (a redeploy, a
cache cleaner), so that load fails inside the scheduler's processing of those requests."""

import json
import os
import re
import shutil

import pytest
import requests

from radixlm.server.process import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
LEAKS = re.compile(
    r"Traceback|File \"|\.py\b|/root|/home|/tmp|site-packages|radixlm/|Error\b|tokenizer"
)
STOP = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True, "stop": ["zzz"]}


def _no_leak(text: str) -> None:
    assert not LEAKS.search(text), f"an error leaks internals: {text[:500]}"


def _sse(r: requests.Response) -> list[str]:
    return [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def broken(tiny_model_dir, tmp_path_factory):
    """A server on a copy of the tiny model whose tokenizer files are moved away after it
    started."""
    model = str(tmp_path_factory.mktemp("model") / "tiny")
    shutil.copytree(tiny_model_dir, model)
    s = ServerProcess("--model-path", model, *TINY)
    # One answered request: the detokenizer has its tokenizer (the scheduler loads its own only
    # later).
    plain = {k: v for k, v in STOP.items() if k != "stop"}
    assert requests.post(
        s.url + "/generate", json={"text": "hi", "sampling_params": plain}, timeout=60
    ).ok
    aside = model + ".tokenizer"
    os.makedirs(aside)
    names = [
        n
        for n in os.listdir(model)
        if n != "config.json" and not n.startswith(("model", "generation"))
    ]
    for n in names:
        shutil.move(os.path.join(model, n), aside)
    yield s, model, aside, names
    s.stop()


def test_an_internal_failure_is_a_500_with_a_request_id_and_the_server_goes_on(broken):
    s, model, aside, names = broken
    r = requests.post(
        s.url + "/generate",
        json={"text": "hello", "rid": "req-native-1", "sampling_params": STOP},
        timeout=60,
    )
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == 500
    assert "internal error" in err["message"] and "req-native-1" in err["message"]
    assert r.headers["x-request-id"] == "req-native-1"
    _no_leak(r.text)
    # The details are in the server log, under the request id.
    log = s.output()
    assert "request req-native-1 failed: internal error: " in log and "Traceback" in log

    # A stream that already started: an error event, then [DONE].
    r = requests.post(
        s.url + "/generate",
        json={"text": "hello", "rid": "req-stream-1", "stream": True, "sampling_params": STOP},
        timeout=60,
    )
    events = _sse(r)
    assert r.status_code == 200 and events[-1] == "[DONE]", r.text
    err = json.loads(events[-2])["error"]
    assert err["code"] == 500 and "req-stream-1" in err["message"]
    _no_leak(r.text)

    # The OpenAI routes: a 500 (a stream waits for its first output before it answers).
    for stream in (False, True):
        r = requests.post(
            s.url + "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "stop": ["zzz"],
                "stream": stream,
                "temperature": 0,
            },
            timeout=60,
        )
        assert r.status_code == 500, r.text
        assert "internal error" in r.json()["error"]["message"]
        _no_leak(r.text)

    # Requests that do not need the failing part are served meanwhile.
    plain = {k: v for k, v in STOP.items() if k != "stop"}
    r = requests.post(
        s.url + "/generate", json={"text": "hello", "sampling_params": plain}, timeout=60
    )
    assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "length"
    assert requests.get(s.url + "/health", timeout=5).status_code == 200

    # The files back: the same request succeeds, and nothing leaked.
    for n in names:
        shutil.move(os.path.join(aside, n), model)
    r = requests.post(
        s.url + "/generate",
        json={"text": "hello", "rid": "req-native-2", "sampling_params": STOP},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "length", (
        r.text
    )
    info = requests.get(s.url + "/get_server_info", timeout=10).json()
    st = info["internal_state"]
    assert info["num_tracked_requests"] == 0 and st["num_running"] == 0 and st["num_waiting"] == 0
    assert st["req_slots_free"] == st["req_slots_total"] and st["protected_tokens"] == 0
