"""Sessions through the router: a session lives on the worker that opened it, so its turns and its
close go there whatever the policy would pick, without retries elsewhere; another client's key
cannot use or close it; a removed worker's sessions are forgotten. Stand-in workers record what
reached them; the last test runs a real session through the router on two tiny-model servers."""

import itertools
import json
import sys

import pytest
import requests

from radixlm.router.affinity import SessionAffinity
from radixlm.server.process import ServerProcess
from tests.conftest import TINY_SERVE
from tests.router.fake_worker import GENERATED, MODEL_INFO, FakeWorker

ADMIN = "router-admin-key"


def session_worker(tag: str) -> FakeWorker:
    ids = itertools.count()

    def open_session(seen):
        body = json.loads(seen.body or b"{}")
        return 200, json.dumps(
            body.get("session_id") or f"{tag}-{next(ids)}"
        )  # a JSON string, as radixlm

    return FakeWorker(
        {
            "/health": (200, ""),
            "/get_model_info": (200, MODEL_INFO),
            "/generate": (200, GENERATED),
            "/open_session": open_session,
            "/close_session": (200, ""),
            "/v1/messages": (200, {"type": "message"}),
        }
    )


def router(urls):
    def cmd(port):
        return [
            sys.executable,
            "-m",
            "radixlm.cli",
            "router",
            "--port",
            str(port),
            "--worker-urls",
            *urls,
            "--policy",
            "round_robin",
            "--health-check-interval-secs",
            "0.2",
            "--log-level",
            "warning",
            "--admin-api-key",
            ADMIN,
        ]

    return ServerProcess(command=cmd, name="the router")


def post(r, path, body, who="alice"):
    return requests.post(
        r.url + path, json=body, headers={"Authorization": f"Bearer {who}"}, timeout=30
    )


def turn(sid, text="hi"):
    return {"text": text, "sampling_params": {"max_new_tokens": 2}, "session_params": {"id": sid}}


@pytest.fixture(scope="module")
def cluster():
    ws = [session_worker("a"), session_worker("b")]
    r = router([w.url for w in ws])
    yield r, ws
    r.stop()
    for w in ws:
        w.stop()


def test_turns_and_close_go_to_the_sessions_worker(cluster):
    r, ws = cluster
    sids = [post(r, "/open_session", {}).json() for _ in range(4)]
    assert {s[0] for s in sids} == {"a", "b"}  # round robin spread them over both workers
    for sid in sids * 3:  # round robin would alternate; each turn goes home instead
        assert post(r, "/generate", turn(sid)).status_code == 200
    for w, tag in zip(ws, "ab"):
        homes = [json.loads(s.body)["session_params"]["id"] for s in w.requests_to("/generate")]
        assert homes and all(h.startswith(tag) for h in homes)
    for sid in sids:
        assert post(r, "/close_session", {"session_id": sid}).status_code == 200
    closed = [json.loads(s.body)["session_id"] for w in ws for s in w.requests_to("/close_session")]
    assert sorted(closed) == sorted(sids)
    assert all(
        json.loads(s.body)["session_id"].startswith(tag)
        for w, tag in zip(ws, "ab")
        for s in w.requests_to("/close_session")
    )
    # Closed: the router knows it no more.
    gone = post(r, "/generate", turn(sids[0]))
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "session_params.id"


def test_another_clients_key_cannot_use_or_close_a_session(cluster):
    r, ws = cluster
    sid = post(r, "/open_session", {"session_id": "private-1"}, who="alice").json()
    assert sid == "private-1"
    before = sum(len(w.requests_to("/generate")) for w in ws)
    for path, body, param in (
        ("/generate", turn(sid), "session_params.id"),
        ("/close_session", {"session_id": sid}, "session_id"),
    ):
        resp = post(r, path, body, who="mallory")
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    assert sum(len(w.requests_to("/generate")) for w in ws) == before  # nothing reached a worker
    assert post(r, "/generate", turn(sid), who="alice").status_code == 200
    assert post(r, "/close_session", {"session_id": sid}, who="alice").status_code == 200


def test_a_key_sent_as_x_api_key_owns_its_sessions_too(cluster):
    """Anthropic's clients send their key as x-api-key: it tells clients apart as Authorization
    does."""
    r, ws = cluster

    def as_x(path, body, who):
        return requests.post(r.url + path, json=body, headers={"x-api-key": who}, timeout=30)

    sid = as_x("/open_session", {"session_id": "private-x"}, "alice").json()
    resp = as_x("/generate", turn(sid), "mallory")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "session_params.id", (
        resp.text
    )
    assert as_x("/generate", turn(sid), "alice").status_code == 200
    assert as_x("/close_session", {"session_id": sid}, "alice").status_code == 200


def test_a_session_turn_is_not_retried_elsewhere_and_other_apis_are_routed(cluster):
    r, ws = cluster
    sid = post(r, "/open_session", {"session_id": "on-removed"}).json()
    home = next(
        w
        for w in ws
        if w.requests_to("/open_session")
        and json.loads(w.requests_to("/open_session")[-1].body).get("session_id") == sid
    )
    other = next(w for w in ws if w is not home)
    n_other = len(other.requests_to("/generate"))
    gone = requests.post(
        r.url + "/remove_worker",
        params={"url": home.url},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert gone.status_code == 200
    resp = post(r, "/generate", turn(sid))
    assert resp.status_code == 400  # forgotten with its worker, never sent to the other one
    assert len(other.requests_to("/generate")) == n_other
    assert (
        requests.post(
            r.url + "/add_worker",
            params={"url": home.url},
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=10,
        ).status_code
        == 200
    )
    # The other APIs' routes reach a worker (before: the router answered 404 itself).
    assert post(r, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": []}).json() == {
        "type": "message"
    }


def test_affinity_map_is_bounded_lru():
    a = SessionAffinity(capacity=3)
    for i in range(3):
        a.record(f"s{i}", "w", "o")
    assert a.home("s0", "o") == "w"  # used: the most recent now
    a.record("s3", "w", "o")
    assert len(a) == 3 and a.home("s1", "o") is None and a.home("s0", "o") == "w"
    assert a.home("s0", "other") is None


def test_a_real_session_through_the_router_keeps_its_cache(tiny_model_dir, tiny_server):
    # Two workers: the run's shared tiny-model server (its cache flushed) and one of this test's.
    own = ServerProcess("--model-path", tiny_model_dir, *TINY_SERVE)
    ws = [tiny_server, own]
    r = router([w.url for w in ws])
    try:
        sid = post(r, "/open_session", {"capacity_of_str_len": 4096}).json()
        prompt_tokens = 0
        for k in range(4):
            out = post(
                r,
                "/generate",
                {
                    **turn(sid, f" turn {k}: tell me more about the harbour."),
                    "sampling_params": {"max_new_tokens": 8, "temperature": 0},
                },
            )
            assert out.status_code == 200, out.text
            meta = out.json()["meta_info"]
            # Every turn after the first finds the whole history (earlier prompts and outputs)
            # cached.
            assert meta["cached_tokens"] >= prompt_tokens - 1, (k, meta, prompt_tokens)
            prompt_tokens = meta["prompt_tokens"] + meta["completion_tokens"]
        assert post(r, "/close_session", {"session_id": sid}).status_code == 200
    finally:
        r.stop()
        own.stop()
