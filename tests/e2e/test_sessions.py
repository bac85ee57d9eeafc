"""Sessions over HTTP (SGLang's /open_session, /close_session, session_params on /generate): an
agent's history stays pinned in the radix tree under memory pressure, and closing the session (or
its timeout) lets it go."""

import json
import random
import threading
import time

import pytest
import requests

from radixlm.server.process import ServerProcess

POOL = 512  # KV tokens: a few unrelated prompts fill it
TURN_NEW, TURN_OUT, TURNS = 12, 6, 10


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--num-threads",
        "1",
        "--max-total-tokens",
        str(POOL),
        "--enable-invariant-checks",
        "--max-sessions-per-key",
        "3",
    )
    yield s
    s.stop()


def post(url: str, path: str, body: dict) -> requests.Response:
    return requests.post(url + path, json=body, timeout=120)


def state(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"]


def wait_idle(url: str) -> dict:
    for _ in range(600):
        st = state(url)
        if st["num_running"] == 0 and st["num_waiting"] == 0:
            return st
        time.sleep(0.05)
    raise AssertionError("the server did not go idle")


class Pressure:
    """Unrelated traffic: a burst of distinct prompts that together fill the pool (so LRU eviction
    reaches anything unpinned), and a background stream of them meanwhile."""

    def __init__(self, url: str, seed: int):
        self.url, self.rng, self.stop = url, random.Random(seed), threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._background, daemon=True)

    def one(self, rng: random.Random) -> None:
        ids = [rng.randrange(100, 20000) for _ in range(120)]
        r = post(
            self.url,
            "/generate",
            {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
        )
        if r.status_code != 200:
            self.errors.append(r.text)

    def burst(self) -> None:
        seeds = [self.rng.random() for _ in range(6)]  # 6 x 124 tokens > POOL
        threads = [threading.Thread(target=self.one, args=(random.Random(s),)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _background(self) -> None:
        rng = random.Random(self.rng.random())
        while not self.stop.is_set():
            self.one(rng)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        assert not self.errors, self.errors[:3]


def turn_ids(k: int) -> list[int]:
    rng = random.Random(1000 + k)
    return [rng.randrange(100, 20000) for _ in range(TURN_NEW)]


SAMPLING = {"max_new_tokens": TURN_OUT, "ignore_eos": True, "temperature": 0}


def test_ten_turns_under_pressure_stay_cached_and_close_frees_them(tiny):
    url = tiny.url
    # Without a session the same conversation loses its history to the other traffic: the check
    # below can fail.
    history: list[int] = []
    plain_cached, plain_outputs = [], []
    with Pressure(url, 1) as pressure:
        for k in range(TURNS):
            ids = history + turn_ids(k)
            out = post(url, "/generate", {"input_ids": ids, "sampling_params": SAMPLING}).json()
            plain_cached.append((out["meta_info"]["cached_tokens"], len(history) - 1))
            plain_outputs.append(out["output_ids"])
            history = ids + out["output_ids"]
            pressure.burst()
    assert any(cached < covered for cached, covered in plain_cached[1:]), plain_cached

    wait_idle(url)
    assert post(url, "/flush_cache", {}).status_code == 200
    base = wait_idle(url)
    assert base["available_kv_tokens"] == base["max_total_num_tokens"] == POOL

    sid = post(url, "/open_session", {"capacity_of_str_len": 1000}).json()
    assert isinstance(sid, str) and sid
    history = []
    with Pressure(url, 1) as pressure:
        for k in range(TURNS):
            out = post(
                url,
                "/generate",
                {
                    "input_ids": turn_ids(k),
                    "sampling_params": SAMPLING,
                    "session_params": {"id": sid},
                },
            ).json()
            meta = out["meta_info"]
            # The prompt is the whole history plus the new turn; every earlier turn's KV is reused
            # (all but the last output token of the turn before, which no step has computed).
            assert meta["prompt_tokens"] == len(history) + TURN_NEW
            assert meta["cached_tokens"] >= len(history) - 1, (
                k,
                meta["cached_tokens"],
                len(history),
            )
            assert (
                out["output_ids"] == plain_outputs[k]
            )  # the same prompt as the plain conversation's
            history += turn_ids(k) + out["output_ids"]
            pressure.burst()
    st = wait_idle(url)
    assert st["pinned_sessions"] == 1 and st["session_pinned_tokens"] == len(history) - 1
    assert st["protected_tokens"] == len(history) - 1

    assert post(url, "/close_session", {"session_id": sid}).status_code == 200
    st = wait_until(url, lambda s: s["pinned_sessions"] == 0)
    assert st["protected_tokens"] == 0
    assert st["available_kv_tokens"] + st["evictable_tokens"] == base["available_kv_tokens"]
    r = post(url, "/generate", {"text": "hi", "session_params": {"id": sid}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_params.id"


def wait_until(url: str, pred, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        st = state(url)
        if pred(st) or time.time() > deadline:
            return st
        time.sleep(0.1)


def test_timeout_unpins(tiny):
    url = tiny.url
    sid = post(url, "/open_session", {"capacity_of_str_len": 1000, "timeout": 1.0}).json()
    for k in range(2):
        r = post(
            url,
            "/generate",
            {"input_ids": turn_ids(k), "sampling_params": SAMPLING, "session_params": {"id": sid}},
        )
        assert r.status_code == 200, r.text
    assert state(url)["pinned_sessions"] == 1
    st = wait_until(url, lambda s: s["pinned_sessions"] == 0)
    assert st["pinned_sessions"] == 0 and st["protected_tokens"] == 0
    assert st["available_kv_tokens"] + st["evictable_tokens"] == POOL
    r = post(url, "/generate", {"input_ids": [5, 6], "session_params": {"id": sid}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_params.id"


def test_branching_fields(tiny):
    """rid picks the turn to continue, offset cuts its tokens, drop_previous_output keeps its
    prompt."""
    url = tiny.url
    sid = post(url, "/open_session", {}).json()
    try:
        gen = lambda ids, **p: post(
            url,
            "/generate",
            {
                "input_ids": ids,
                "sampling_params": SAMPLING,
                "session_params": {"id": sid, **p},
            },
        )
        a = gen([7, 8, 9], rid=None).json()
        rid_a = a["meta_info"]["id"]
        b = gen([10, 11]).json()
        assert b["meta_info"]["prompt_tokens"] == 3 + TURN_OUT + 2
        c = gen([12], rid=rid_a, drop_previous_output=True).json()
        assert c["meta_info"]["prompt_tokens"] == 4
        d = gen([13], rid=rid_a, offset=2).json()
        assert d["meta_info"]["prompt_tokens"] == 3
        for params, field in [
            ({"rid": "nope"}, "session_params.rid"),
            ({"offset": 99}, "session_params.offset"),
            ({"offset": -1}, "session_params.offset"),
            ({"replace": "yes"}, "session_params.replace"),
            ({"colour": 1}, "session_params.colour"),
        ]:
            r = gen([1], **params)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (params, r.text)
        r = post(url, "/generate", {"input_ids": [1], "session_params": {"id": "unknown"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_params.id"
        r = post(url, "/generate", {"input_ids": [[1], [2]], "session_params": {"id": sid}})
        assert r.status_code == 400
        # Streamed: a turn like the others; a bad one is refused before the stream starts.
        with requests.post(
            url + "/generate",
            json={
                "input_ids": [14],
                "sampling_params": SAMPLING,
                "stream": True,
                "session_params": {"id": sid},
            },
            stream=True,
            timeout=120,
        ) as r:
            chunks = [ln for ln in r.iter_lines(decode_unicode=True) if ln.startswith("data: {")]
        last = json.loads(chunks[-1][len("data: ") :])
        assert (
            r.status_code == 200 and last["meta_info"]["prompt_tokens"] == 3 + TURN_OUT + 1
        )  # after turn d
        r = post(
            url,
            "/generate",
            {"input_ids": [1], "stream": True, "session_params": {"id": sid, "rid": "x"}},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_params.rid"
    finally:
        post(url, "/close_session", {"session_id": sid})
    r = post(url, "/close_session", {"session_id": sid})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"


def test_open_limits_and_bad_fields(tiny):
    url = tiny.url
    ids = [post(url, "/open_session", {}).json() for _ in range(3)]
    try:
        r = post(url, "/open_session", {})
        assert r.status_code == 429 and "--max-sessions-per-key" in r.json()["error"]["message"]
        r = post(url, "/open_session", {"session_id": ids[0]})
        assert r.status_code in (400, 429)
    finally:
        for sid in ids:
            post(url, "/close_session", {"session_id": sid})
    for body, field in [
        ({"capacity_of_str_len": 0}, "capacity_of_str_len"),
        ({"timeout": -1}, "timeout"),
        ({"session_id": ""}, "session_id"),
        ({"streaming": True}, "streaming"),
    ]:
        r = post(url, "/open_session", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (body, r.text)
    for path, body in [
        ("/open_session", []),
        ("/open_session", {"session_id": 5}),
        ("/close_session", {}),
        ("/close_session", {"session_id": ["x"]}),
        ("/open_session", {"timeout": 10**400}),
    ]:
        r = post(url, path, body)
        assert r.status_code in (200, 400), (path, body, r.text)
        if r.status_code == 200 and path == "/open_session":
            post(url, "/close_session", {"session_id": r.json()})
    sid = post(url, "/open_session", {"session_id": "mine"}).json()
    assert sid == "mine"
    r = post(url, "/open_session", {"session_id": "mine"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
    post(url, "/close_session", {"session_id": "mine"})
    assert wait_until(url, lambda s: s["pinned_sessions"] == 0)["protected_tokens"] == 0
