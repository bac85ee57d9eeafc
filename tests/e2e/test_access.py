"""Who may do what on the server (issue 35): admin actions need --admin-api-key, and a user's
empty rid aborts nothing (finding 4); browsers cannot reach a server on their user's machine
(Host and Origin checks, JSON only as application/json, state changes by POST only), and keys
appear on no command line and in no output, `serve --dp` included (finding 8)."""

import json
import os
import threading

import psutil
import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.forked_servers import exec_servers

USER, ADMIN = "user-key-0123456789", "admin-key-9876543210"
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
APP = "https://app.example"
BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """Keys through the environment, as `serve --dp` and Runtime hand them to a server."""
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--allowed-origins",
        APP,
        *TINY,
        env={"RADIXLM_API_KEY": USER, "RADIXLM_ADMIN_API_KEY": ADMIN},
    )
    yield s
    s.stop()


def as_(key, **headers):
    return {"Authorization": f"Bearer {key}", **headers}


def test_admin_actions_need_the_admin_key(server):
    u = server.url
    flush = requests.post(u + "/flush_cache", headers=as_(USER), timeout=10)
    assert flush.status_code == 403 and flush.json()["error"]["type"] == "permission_error"
    empty = requests.post(u + "/abort_request", json={"rid": ""}, headers=as_(USER), timeout=10)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "rid"
    everything = requests.post(
        u + "/abort_request", json={"abort_all": True}, headers=as_(USER), timeout=10
    )
    assert everything.status_code == 403 and everything.json()["error"]["param"] == "abort_all"
    assert (
        requests.post(
            u + "/abort_request", json={"rid": "someone"}, headers=as_(USER), timeout=10
        ).status_code
        == 200
    )
    assert requests.post(u + "/flush_cache", headers=as_(ADMIN), timeout=30).status_code == 200
    assert (
        requests.get(u + "/flush_cache", headers=as_(ADMIN), timeout=10).status_code == 405
    )  # POST only
    # The admin key is accepted wherever the user key is; a wrong key is still a 401.
    assert (
        requests.post(u + "/generate", json=BODY, headers=as_(ADMIN), timeout=60).status_code == 200
    )
    assert requests.post(u + "/flush_cache", headers=as_("wrong"), timeout=10).status_code == 401
    info = requests.get(u + "/get_server_info", headers=as_(USER), timeout=10).json()
    assert info["api_key"] == info["admin_api_key"] == "***"


def _stream(url, key, tokens, first_chunk: threading.Event, out: dict):
    body = {
        "text": "Count:",
        "stream": True,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
    }
    with requests.post(
        url + "/generate", json=body, headers=as_(key), stream=True, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                first_chunk.set()
                out["last"] = json.loads(line[6:])
    first_chunk.set()


def test_a_user_cannot_abort_other_users_requests(server):
    """An empty rid from a user leaves a running stream alone; from the admin it aborts it."""
    for key, aborted in ((USER, False), (ADMIN, True)):
        started, out = threading.Event(), {}
        t = threading.Thread(target=_stream, args=(server.url, USER, 300, started, out))
        t.start()
        assert started.wait(60)
        r = requests.post(
            server.url + "/abort_request", json={"rid": ""}, headers=as_(key), timeout=10
        )
        assert r.status_code == (200 if aborted else 400), r.text
        t.join(120)
        meta = out["last"]["meta_info"]
        if aborted:
            assert meta["finish_reason"]["type"] == "abort", meta
        else:
            assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 300, (
                meta
            )


def test_browser_requests_are_refused(server):
    u, port = server.url, server.url.rsplit(":", 1)[1]
    ok = as_(USER)
    # JSON only as application/json: these are what a page may send anywhere without asking first.
    for ctype in (
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        headers = {**ok, **({"Content-Type": ctype} if ctype else {})}
        r = requests.post(u + "/generate", data=json.dumps(BODY), headers=headers, timeout=10)
        assert r.status_code == 415 and r.json()["error"]["param"] == "content-type", (
            ctype,
            r.text,
        )
    # Another origin's page, with or without the key; a no-cors request (Sec-Fetch-Site, no Origin).
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
    ):
        r = requests.post(u + "/generate", json=BODY, headers={**ok, **headers}, timeout=10)
        assert r.status_code == 403 and r.json()["error"]["param"] == "origin", (headers, r.text)
    followed_link = {
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "navigate",
    }  # reads nothing, changes nothing
    assert (
        requests.get(u + "/get_model_info", headers={**ok, **followed_link}, timeout=10).status_code
        == 200
    )
    # DNS rebinding: a foreign name that resolves to 127.0.0.1.
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}"):
        r = requests.get(u + "/get_model_info", headers={**ok, "Host": host}, timeout=10)
        assert r.status_code == 403 and r.json()["error"]["param"] == "host", (host, r.text)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
        assert (
            requests.get(
                u + "/get_model_info", headers={**ok, "Host": host}, timeout=10
            ).status_code
            == 200
        )
    # The server's own pages (/docs) and the allowed origin, which also gets CORS answers.
    assert (
        requests.post(
            u + "/generate", json=BODY, headers={**ok, "Origin": u}, timeout=60
        ).status_code
        == 200
    )
    r = requests.post(u + "/generate", json=BODY, headers={**ok, "Origin": APP}, timeout=60)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    pre = requests.options(
        u + "/generate",
        headers={
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
        timeout=10,
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == APP
    assert (
        "access-control-allow-origin"
        not in requests.options(
            u + "/generate",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
            timeout=10,
        ).headers
    )


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(
            item.split("=", 1)
            for item in f.read().decode(errors="replace").split("\0")
            if "=" in item
        )


def _output_of(pid: int) -> str:
    """What a process printed so far (its stdout: a file, under ServerProcess)."""
    with open(f"/proc/{pid}/fd/1", errors="replace") as f:
        return f.read()


STORAGE_KEY = "storage-key-0123456789abcdef"


@pytest.fixture(scope="module")
def dp(tiny_model_dir, tmp_path_factory):
    """`serve --dp 2` with the client keys in its environment and --hicache-storage-key K (one start
    for the two tests below: a router and two servers). Exec'd, not forked
    (tests/forked_servers.py): its command line and environment are what the tests read."""
    with exec_servers():
        s = ServerProcess(
            "--dp",
            "2",
            "--model-path",
            tiny_model_dir,
            "--kv-memory-gb",
            "0.05",
            "--enable-invariant-checks",
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "file",
            "--hicache-storage-dir",
            str(tmp_path_factory.mktemp("dp-storage") / "l3"),
            "--hicache-storage-key",
            STORAGE_KEY,
            env={"RADIXLM_API_KEY": USER, "RADIXLM_ADMIN_API_KEY": ADMIN},
        )
    yield s
    s.stop()


def test_keys_on_no_command_line_and_in_no_output(server, dp):
    """`serve --dp 2` with the keys in the environment: no process's command line (what `ps`
    shows every user) holds the client keys or the keys the router made for its servers, and
    neither does anything printed."""
    assert USER not in server.output() and ADMIN not in server.output()  # the start-up banner
    procs = [psutil.Process(dp.proc.pid), *psutil.Process(dp.proc.pid).children(recursive=True)]
    # The router's servers: its children (theirs, forked, show the same command line).
    servers = [p for p in psutil.Process(dp.proc.pid).children() if "serve" in p.cmdline()]
    assert len(servers) == 2
    worker_keys = {
        _environ(p.pid)[k] for p in servers for k in ("RADIXLM_API_KEY", "RADIXLM_ADMIN_API_KEY")
    }
    assert len(worker_keys) == 2 and not worker_keys & {
        USER,
        ADMIN,
    }  # a user key and an admin key of its own
    secrets = {USER, ADMIN, *worker_keys}
    for p in procs:
        cmdline = " ".join(p.cmdline())
        assert not any(s in cmdline for s in secrets) and "api-key" not in cmdline, cmdline
    # The whole thing works: user routes with the user key, admin routes with the admin key.
    assert (
        requests.post(dp.url + "/generate", json=BODY, headers=as_(USER), timeout=60).status_code
        == 200
    )
    assert requests.post(dp.url + "/flush_cache", headers=as_(USER), timeout=10).status_code == 403
    flushed = requests.post(dp.url + "/flush_cache", headers=as_(ADMIN), timeout=30)
    assert flushed.status_code == 200 and len(flushed.json()["workers"]) == 2
    outputs = [dp.output(), *(_output_of(p.pid) for p in servers)]
    assert not any(s in out for s in secrets for out in outputs)
    assert os.environ.get("RADIXLM_API_KEY") is None  # the test's own environment was not changed


def test_dp_workers_get_the_storage_key_by_environment(dp):
    """`serve --dp 2 --hicache-storage-key K`: the key authenticates the disk cache's files in each
    worker, which gets it in its environment; no worker's command line or output holds it."""
    key = STORAGE_KEY
    servers = [p for p in psutil.Process(dp.proc.pid).children() if "serve" in p.cmdline()]
    assert len(servers) == 2
    for p in servers:
        assert _environ(p.pid)["RADIXLM_HICACHE_STORAGE_KEY"] == key
        assert key not in " ".join(p.cmdline()) and "storage-key" not in " ".join(p.cmdline())
        assert key not in _output_of(p.pid)
    assert (
        requests.post(dp.url + "/generate", json=BODY, headers=as_(USER), timeout=60).status_code
        == 200
    )
