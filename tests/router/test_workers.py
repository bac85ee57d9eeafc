"""The worker registry's circuit breaker: failures in a row (checks or requests) open it, successful
checks close it again, a success in between resets the count, and a worker going down drops its
entries from the cache-aware tree. A worker gets traffic and the key only once verified; the
allow-list and URL checks."""

import asyncio

import httpx
import pytest

from radixlm.router.policies import CacheAwareConfig, CacheAwarePolicy
from radixlm.router.workers import HealthConfig, WorkerNotAllowed, WorkerRegistry, normalize_url

A, B = "http://a:1", "http://b:2"
MODEL_INFO = {"model_path": "m", "is_generation": True}


def keyed_worker(key):
    """A radixlm worker's answers: /health open, /get_model_info behind the key."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.headers.get("authorization") != f"Bearer {key}":
            return httpx.Response(
                401, json={"error": {"type": "authentication_error", "message": "no key"}}
            )
        return httpx.Response(200, json=MODEL_INFO)

    return handler


def check_all(reg, handler):
    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await reg.check_all(client)

    asyncio.run(run())


def registry(**kw):
    policy = CacheAwarePolicy(CacheAwareConfig())
    reg = WorkerRegistry(
        HealthConfig(failure_threshold=3, success_threshold=2),
        on_unhealthy=policy.remove_worker,
        **kw,
    )
    reg.add(A)
    reg.add(B)
    assert reg.healthy() == []  # nothing before the first probe
    check_all(reg, lambda request: httpx.Response(200, json=MODEL_INFO))
    assert reg.healthy() == [A, B]
    return reg, policy


def test_breaker_opens_after_failures_in_a_row_and_closes_after_successes():
    reg, _ = registry()
    reg.record(A, False)
    reg.record(A, False)
    reg.record(A, True)  # a success in between: the count starts again
    reg.record(A, False)
    reg.record(A, False)
    assert reg.healthy() == [A, B]
    reg.record(A, False)
    assert reg.healthy() == [B]
    reg.record(A, True)  # one success is not enough to close it (half-open)
    assert reg.healthy() == [B]
    reg.record(A, False)  # and a failure while half-open starts the successes over
    reg.record(A, True)
    assert reg.healthy() == [B]
    reg.record(A, True)
    assert reg.healthy() == [A, B]
    reg.record("http://unknown:3", False)  # a worker removed meanwhile: ignored
    assert set(reg.workers) == {A, B}


def test_a_worker_going_down_or_removed_loses_its_tree_entries():
    reg, policy = registry()
    text = "a shared document " * 20
    first = policy.select([A, B], {A: 0, B: 0}, text)
    other = B if first == A else A
    assert policy.select([A, B], {A: 0, B: 0}, text + "q2") == first  # cached there: sticky
    for _ in range(3):
        reg.record(first, False)
    assert first not in policy.tree.tenant_chars
    assert policy.select(reg.healthy(), reg.loads(), text + "q3") == other
    assert reg.remove(other) and other not in policy.tree.tenant_chars
    assert not reg.remove(other)


def test_health_checks_against_a_worker_that_fails_and_recovers():
    up = {"ok": False}
    seen_auth = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_auth.append((request.url.path, request.headers.get("authorization")))
        if request.url.host == "a" and not up["ok"]:
            raise httpx.ConnectError("refused", request=request)
        return keyed_worker("k")(request)

    policy = CacheAwarePolicy(CacheAwareConfig())
    reg = WorkerRegistry(
        HealthConfig(failure_threshold=3, success_threshold=2),
        {"Authorization": "Bearer k"},
        policy.remove_worker,
    )
    reg.add(A)
    reg.add(B)
    check_all(reg, handler)
    assert reg.healthy() == [B]  # A is down: not verified, no traffic
    up["ok"] = True
    check_all(reg, handler)
    assert reg.healthy() == [A, B]
    up["ok"] = False

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            for _ in range(3):
                await reg.check_all(client)
            assert reg.healthy() == [B]
            up["ok"] = True
            assert await reg.check(client, A) and reg.healthy() == [B]
            assert await reg.check(client, A) and reg.healthy() == [A, B]

    asyncio.run(run())
    # The key only on the model check that a radixlm 401 asked for; never on /health.
    keyed = {(path, auth) for path, auth in seen_auth if auth}
    assert keyed == {("/get_model_info", "Bearer k")}


def test_only_a_worker_that_answers_like_one_is_verified():
    answers = {
        "a": lambda r: httpx.Response(
            200, text="<html>not a model server</html>"
        ),  # /get_model_info too
        "b": lambda r: (
            httpx.Response(200) if r.url.path == "/health" else httpx.Response(404, json={})
        ),
    }
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return answers[request.url.host](request)

    reg = WorkerRegistry(HealthConfig(), {"Authorization": "Bearer k"})
    reg.add(A)
    reg.add(B)
    for _ in range(3):
        check_all(reg, handler)
    assert reg.healthy() == [] and reg.verified() == [] and set(seen) == {None}
    assert "/get_model_info" in reg.workers[B].note
    reg.record(A, True)  # a request's outcome cannot make an unverified worker healthy
    assert reg.healthy() == []


def test_worker_url_must_be_http():
    assert normalize_url(" http://h:1/ ") == "http://h:1"
    with pytest.raises(ValueError, match="http"):
        normalize_url("h:1")
    for bad in (
        "http://u:p@h:1",
        "http://h:1/?q=1",
        "http://h:1#x",
        "http://h:123456",
        "http://:1",
    ):
        with pytest.raises(ValueError):
            normalize_url(bad)


def test_worker_allowlist():
    reg = WorkerRegistry(allowlist=("10.0.*", "*.internal", "gpu-?:30000"))
    for ok in ("http://10.0.3.4:8000", "https://a.b.internal", "http://gpu-1:30000"):
        reg.add(ok)
    for bad in (
        "http://10.1.0.1:1",
        "http://internal",
        "http://gpu-1:30001",
        "http://a.internal.evil.com",
        "http://127.0.0.1:1",
    ):
        with pytest.raises(WorkerNotAllowed):
            reg.add(bad)
