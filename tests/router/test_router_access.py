"""The router's access rules, seen from its HTTP side and from what reaches the workers (stand-in
workers that record every request): admin routes need the admin key and a user's abort never
fans out as abort-all (issue 35, finding 4); a new worker gets no traffic and no key until it is
verified, the allow-list, the body limit and finite upstream waits (finding 5); browser checks,
JSON content types and keys out of command lines and output (finding 8)."""

import json
import sys
import time

import psutil
import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.router.fake_worker import FakeWorker, radixlm_like

KEY, ADMIN, WKEY, WADMIN = (
    "router-user-key-1",
    "router-admin-key-2",
    "worker-user-key-3",
    "worker-admin-key-4",
)
SECRETS = (KEY, ADMIN, WKEY, WADMIN)
BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}


def router(urls, *extra, env=None):
    """`radixlm router` with its four keys given in the environment (never on its command line)."""

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
            "--health-check-interval-secs",
            "0.2",
            "--health-failure-threshold",
            "2",
            "--health-success-threshold",
            "1",
            "--log-level",
            "info",
            *extra,
        ]

    env = (
        env
        if env is not None
        else {
            "RADIXLM_API_KEY": KEY,
            "RADIXLM_ADMIN_API_KEY": ADMIN,
            "RADIXLM_WORKER_API_KEY": WKEY,
            "RADIXLM_WORKER_ADMIN_API_KEY": WADMIN,
        }
    )
    return ServerProcess(command=cmd, name="the router", env=env)


def as_(key):
    return {"Authorization": f"Bearer {key}"}


def post(r, path, body=None, key=KEY, **kw):
    return requests.post(
        r.url + path, json=body, headers={**as_(key), **kw.pop("headers", {})}, timeout=30, **kw
    )


def wait_for(cond, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.fixture(scope="module")
def cluster():
    good = FakeWorker(radixlm_like(WKEY, WADMIN))
    r = router([good.url], "--worker-allowlist", "127.0.0.1", "--max-request-body-bytes", "4096")
    yield r, good
    r.stop()
    good.stop()


def test_admin_routes_need_the_admin_key_and_user_aborts_stay_one_rid(cluster):
    r, good = cluster
    good.seen.clear()
    for path in (
        "/flush_cache",
        "/add_worker?url=http://127.0.0.1:9",
        "/remove_worker?url=" + good.url,
    ):
        refused = post(r, path)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["error"]["type"] == "permission_error"
    # A user's empty rid is a 400 naming the field, abort_all a 403; neither reaches a worker.
    empty = post(r, "/abort_request", {"rid": ""})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "rid"
    assert post(r, "/abort_request", {"abort_all": True}).status_code == 403
    assert post(r, "/abort_request", {}).status_code == 400
    assert good.requests_to("/abort_request") == [] and good.requests_to("/flush_cache") == []
    # A user's abort goes out as its one rid, with the workers' user key.
    assert post(r, "/abort_request", {"rid": "r-1"}).status_code == 200
    [seen] = good.requests_to("/abort_request")
    assert json.loads(seen.body) == {"rid": "r-1"} and seen.auth == f"Bearer {WKEY}"
    # The admin's: abort every request and flush, with the workers' admin key.
    good.seen.clear()
    assert post(r, "/abort_request", {"rid": ""}, key=ADMIN).status_code == 200
    assert post(r, "/flush_cache", key=ADMIN).status_code == 200
    [abort], [flush] = good.requests_to("/abort_request"), good.requests_to("/flush_cache")
    assert (
        json.loads(abort.body) == {"abort_all": True}
        and abort.auth == flush.auth == f"Bearer {WADMIN}"
    )
    assert (
        requests.get(r.url + "/flush_cache", headers=as_(ADMIN), timeout=10).status_code == 405
    )  # POST only


def test_x_api_key_opens_the_router_and_stays_there(cluster):
    """Anthropic's clients send the key as x-api-key: the router takes it as its own key and, like
    Authorization, never passes it on (the worker gets the worker key)."""
    r, good = cluster
    good.seen.clear()
    assert (
        requests.post(
            r.url + "/generate", json=BODY, headers={"x-api-key": "wrong"}, timeout=30
        ).status_code
        == 401
    )
    ok = requests.post(r.url + "/generate", json=BODY, headers={"x-api-key": KEY}, timeout=30)
    assert ok.status_code == 200, ok.text
    [seen] = good.requests_to("/generate")
    assert seen.auth == f"Bearer {WKEY}" and "x-api-key" not in seen.headers


def test_an_added_worker_gets_no_traffic_and_no_key_until_verified(cluster):
    r, good = cluster
    # Answers /health, but is no radixlm or SGLang server: a typo, or someone else's service.
    stranger = FakeWorker(
        {
            "/health": (200, ""),
            "/get_model_info": (200, "<html>hello</html>"),
            "/generate": (503, {"error": "no"}),
        }
    )
    try:
        added = post(r, "/add_worker?url=" + stranger.url, key=ADMIN)
        assert added.status_code == 200 and added.json()["healthy"] is False, added.text
        assert "/get_model_info" in added.json()["note"]
        for _ in range(6):
            assert post(r, "/generate", BODY).status_code == 200
        wait_for(
            lambda: len(stranger.requests_to("/health")) >= 3
        )  # probed again and again: still refused
        assert stranger.requests_to("/generate") == []
        assert all(s.auth is None for s in stranger.seen), [s.path for s in stranger.seen if s.auth]
        listed = {
            w["url"]: w
            for w in requests.get(r.url + "/list_workers", headers=as_(KEY), timeout=10).json()[
                "workers"
            ]
        }
        assert listed[stranger.url]["healthy"] is False and listed[good.url]["healthy"] is True
        # The real worker got its key only after its keyless answer was a radixlm 401, and with
        # every request.
        assert good.requests_to("/generate") and all(
            s.auth == f"Bearer {WKEY}" for s in good.requests_to("/generate")
        )
        assert all(s.auth is None for s in good.requests_to("/health"))
        assert post(r, "/remove_worker?url=" + stranger.url, key=ADMIN).status_code == 200
    finally:
        stranger.stop()


def test_worker_allowlist_and_urls(cluster):
    r, _ = cluster
    for url in ("http://localhost:9", "http://10.0.0.1:9", "http://127.0.0.1.evil.example:9"):
        refused = post(r, "/add_worker?url=" + url, key=ADMIN)
        assert refused.status_code == 403 and refused.json()["error"]["param"] == "url", (
            refused.text
        )
    for url in (
        "http://user:pw@127.0.0.1:9",
        "file:///etc/passwd",
        "http://127.0.0.1:9/?x=1",
        "http://127.0.0.1:99999",
    ):
        assert post(r, "/add_worker", key=ADMIN, params={"url": url}).status_code == 400, url


def test_body_limit_and_json_content_type(cluster):
    r, good = cluster
    good.seen.clear()
    big = {"text": "x" * 5000}
    assert post(r, "/generate", big).status_code == 413  # on Content-Length
    chunked = requests.post(
        r.url + "/generate",
        data=iter([b'{"text": "', b"x" * 5000, b'"}']),
        headers={**as_(KEY), "Content-Type": "application/json"},
        timeout=30,
    )
    assert chunked.status_code == 413 and chunked.json()["error"]["param"] == "body"
    for ctype in (None, "text/plain", "application/x-www-form-urlencoded"):
        headers = {**as_(KEY), **({"Content-Type": ctype} if ctype else {})}
        refused = requests.post(
            r.url + "/generate", data=json.dumps(BODY), headers=headers, timeout=30
        )
        assert refused.status_code == 415 and refused.json()["error"]["param"] == "content-type", (
            ctype
        )
    assert post(r, "/generate", BODY).status_code == 200
    assert len(good.requests_to("/generate")) == 1  # none of the refused ones went on


def test_browser_checks(cluster):
    r, good = cluster
    port = r.url.rsplit(":", 1)[1]
    evil = post(r, "/generate", BODY, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and evil.json()["error"]["param"] == "origin"
    rebound = requests.get(
        r.url + "/list_workers", headers={**as_(KEY), "Host": f"evil.example:{port}"}, timeout=10
    )
    assert rebound.status_code == 403 and rebound.json()["error"]["param"] == "host"
    same = post(r, "/generate", BODY, headers={"Origin": r.url})  # its own page (e.g. /docs)
    assert same.status_code == 200
    # The client's Origin stays at the router (a worker would refuse it as cross-origin).
    assert all("origin" not in s.headers for s in good.requests_to("/generate"))


def test_keys_in_no_command_line_or_output(cluster):
    r, _ = cluster
    cmdlines = [
        " ".join(p.cmdline())
        for p in [psutil.Process(r.proc.pid), *psutil.Process(r.proc.pid).children(True)]
    ]
    for secret in SECRETS:
        assert not any(secret in c for c in cmdlines)
        assert secret not in r.output()
    assert requests.get(r.url + "/health", timeout=10).status_code == 200


def test_upstream_waits_are_finite():
    slow = FakeWorker(radixlm_like(), delays={"/generate": 20})
    r = router(
        [slow.url],
        "--request-timeout-secs",
        "0.5",
        "--max-retries",
        "1",
        "--retry-backoff-secs",
        "0.01",
        env={},
    )
    try:
        t = time.time()
        resp = requests.post(r.url + "/generate", json=BODY, timeout=60)
        assert resp.status_code == 503 and time.time() - t < 5, (resp.status_code, time.time() - t)
        assert "ReadTimeout" in resp.json()["error"]["message"]
    finally:
        r.stop()
        slow.stop()
