"""The worker registry's circuit breaker: failures in a row (checks or requests) open it, successful
checks close it again, a success in between resets the count, and a worker going down drops its
entries from the cache-aware tree."""

import asyncio

import httpx
import pytest

from radixlm.router.policies import CacheAwareConfig, CacheAwarePolicy
from radixlm.router.workers import HealthConfig, WorkerRegistry, normalize_url

A, B = "http://a:1", "http://b:2"


def registry(**kw):
    policy = CacheAwarePolicy(CacheAwareConfig())
    reg = WorkerRegistry(HealthConfig(failure_threshold=3, success_threshold=2), on_unhealthy=policy.remove_worker, **kw)
    reg.add(A)
    reg.add(B)
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
        seen_auth.append(request.headers.get("authorization"))
        if request.url.host == "b":
            return httpx.Response(200, json={})
        if not up["ok"]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={})

    reg, _ = registry(headers={"Authorization": "Bearer k"})

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            for _ in range(3):
                await reg.check_all(client)
            assert reg.healthy() == [B]
            up["ok"] = True
            assert await reg.check(client, A) and reg.healthy() == [B]
            assert await reg.check(client, A) and reg.healthy() == [A, B]

    asyncio.run(run())
    assert set(seen_auth) == {"Bearer k"}  # the workers' key on every check


def test_worker_url_must_be_http():
    assert normalize_url(" http://h:1/ ") == "http://h:1"
    with pytest.raises(ValueError, match="http"):
        normalize_url("h:1")
