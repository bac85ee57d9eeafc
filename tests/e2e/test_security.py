"""Security of the HTTP server: --api-key on every route but /health (compared in constant time),
loopback by default, and error bodies without stack traces or file paths. (Admin actions, browser
checks and keys kept out of command lines: test_access.py.)"""

import asyncio
import re

import httpx
import psutil
import pytest
import requests
from fastapi import FastAPI
from fastapi.testclient import TestClient

import radixlm.http_access as http_access
from radixlm.config import ServerArgs
from radixlm.router.server import RouterArgs
from radixlm.server.process import ServerProcess

KEY = "s3cret-key-0123456789"
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
LEAKS = re.compile(r"Traceback|File \"|\.py\b|/root|/home|/tmp|site-packages|radixlm/")


def _no_leak(body: str) -> None:
    assert not LEAKS.search(body), f"an error body leaks internals: {body[:500]}"


@pytest.fixture(scope="module")
def keyed(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, "--api-key", KEY, "--enable-metrics", *TINY)
    yield s
    s.stop()


def _routes(url: str) -> list[tuple[str, str]]:
    spec = requests.get(
        url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    ).json()
    out = [
        (m.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, ops in spec["paths"].items()
        for m in ops
    ]
    # Routes FastAPI and the metrics mount add outside the schema.
    return out + [
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/redoc"),
        ("GET", "/metrics"),
    ]


def test_every_route_but_health_needs_the_key(keyed):
    routes = _routes(keyed.url)
    paths = {p for _, p in routes}
    assert {
        "/generate",
        "/v1/chat/completions",
        "/flush_cache",
        "/abort_request",
        "/get_server_info",
        "/v1/models",
        "/metrics",
    } <= paths
    wrong = [
        None,
        "Bearer wrong",
        f"Bearer {KEY[:-1]}",
        f"Bearer {KEY}x",
        f"Bearer {KEY.upper()}",
        KEY,
        f"Basic {KEY}",
    ]
    for method, path in routes:
        for auth in wrong:
            headers = {"Authorization": auth} if auth else {}
            r = requests.request(method, keyed.url + path, headers=headers, json={}, timeout=10)
            if path == "/health":
                assert r.status_code == 200
                continue
            assert r.status_code == 401, (method, path, auth, r.status_code)
            if path.startswith("/api/"):  # Ollama's API: its own error shape
                assert list(r.json()) == ["error"] and "API key" in r.json()["error"]
            else:
                assert r.json()["error"]["type"] == "authentication_error"
    ok = {"Authorization": f"Bearer {KEY}"}
    assert requests.get(keyed.url + "/metrics", headers=ok, timeout=10).status_code == 200
    # An admin action: without --admin-api-key nobody may (the user key is a user's).
    flush = requests.post(keyed.url + "/flush_cache", headers=ok, timeout=10)
    assert flush.status_code == 403 and "--admin-api-key" in flush.json()["error"]["message"]
    assert (
        requests.post(
            keyed.url + "/abort_request", json={"rid": "none"}, headers=ok, timeout=10
        ).status_code
        == 200
    )
    r = requests.post(
        keyed.url + "/generate",
        json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
        headers=ok,
        timeout=60,
    )
    assert r.status_code == 200
    info = requests.get(keyed.url + "/get_server_info", headers=ok, timeout=10).json()
    assert info["api_key"] == "***"  # the key is never echoed


def test_error_bodies_from_every_layer_carry_no_trace_or_path(keyed):
    ok = {"Authorization": f"Bearer {KEY}"}
    bad = [
        ("/generate", {"text": "x", "sampling_params": {"regex": "("}}),
        ("/generate", {"text": "x", "sampling_params": {"json_schema": "{not json"}}),
        ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= undefined_rule"}}),
        ("/generate", {"text": "x", "sampling_params": {"stop_regex": "(?P<"}}),
        ("/generate", {"input_ids": [10**9]}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "chat_template_kwargs": {"add_generation_prompt": "not a bool", "x": {"y": 1}},
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": 5}},
                },
            },
        ),
        ("/v1/completions", {"prompt": "x", "max_tokens": -1}),
        ("/v1/completions", {"prompt": "x", "logprobs": 10**6}),
    ]
    for path, body in bad:
        r = requests.post(keyed.url + path, json=body, headers=ok, timeout=60)
        assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
        assert r.json()["error"]["message"]
        _no_leak(r.text)
    r = requests.post(
        keyed.url + "/generate",
        data=b"{",
        headers={**ok, "Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400
    _no_leak(r.text)


def test_an_internal_error_is_a_500_without_details():
    from radixlm.server.http_server import create_app

    async def no_state():
        raise AssertionError("not started in this test")

    app = create_app(no_state)
    app.state.api_key = None

    @app.get("/boom")
    async def boom():
        raise RuntimeError(
            'File "/root/secret/radixlm/model.py", line 3: cannot open /home/user/weights.bin'
        )

    client = TestClient(app, raise_server_exceptions=False)  # not entered: no lifespan, no engine
    r = client.get("/boom")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    _no_leak(r.text)


def test_key_comparison_is_constant_time(monkeypatch):
    """The check goes through secrets.compare_digest on the whole header, for right and wrong keys
    alike: no early exit on the first differing byte, on length, or on a missing header."""
    calls = []
    real = http_access.secrets.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(http_access.secrets, "compare_digest", spy)
    app = FastAPI()
    app.get("/x")(lambda: {"ok": True})
    app.get("/health")(lambda: {"ok": True})
    app.state.api_key = KEY
    app.add_middleware(http_access.AccessMiddleware)

    def call(path, auth):
        async def go():
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t"
            ) as c:
                return await c.get(
                    path, headers={"Authorization": auth} if auth is not None else {}
                )

        return asyncio.run(go())

    cases = {
        f"Bearer {KEY}": 200,
        f"Bearer {KEY[:-1]}X": 401,
        f"Bearer {KEY[:3]}": 401,
        f"Bearer {KEY}{KEY}": 401,
        "": 401,
        None: 401,
    }
    for auth, status in cases.items():
        calls.clear()
        assert call("/x", auth).status_code == status
        assert calls == [((auth or "").encode(), f"Bearer {KEY}".encode())]
    calls.clear()
    assert call("/health", None).status_code == 200 and calls == []


def test_loopback_by_default(tiny_server):
    assert ServerArgs().host == "127.0.0.1" and RouterArgs(worker_urls=[]).host == "127.0.0.1"
    s = tiny_server  # the run's shared tiny-model server: started without --host
    listening = [
        c.laddr
        for c in psutil.Process(s.proc.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
