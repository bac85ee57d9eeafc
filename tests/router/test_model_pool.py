"""The multi-model pool's rules (radixlm/router/model_pool.py) with stand-in children (no
processes): loads on first use, one load per model however many wait, the least recently used
idle model unloads beyond models_max, a busy one drains and never unloads under its requests,
failures and the load timeout end a wait with the reason."""

import asyncio

import pytest

from radixlm.router.model_catalog import ModelSpec
from radixlm.router.model_child import ChildFailed
from radixlm.router.model_pool import ModelPool, ModelUnavailable, UnknownModel


class FakeProc:
    def __init__(self):
        self.exited = asyncio.Event()
        self.pid = 1

    async def wait(self):
        await self.exited.wait()


class FakeChild:
    """What the pool reads of a ModelChild; `events` records starts and stops in order."""

    def __init__(self, name, events, ready: asyncio.Event, fail: str | None):
        self.name, self.events, self.ready, self.fail = name, events, ready, fail
        self.port, self.url, self.pid = 0, "http://fake", 1
        self.proc = FakeProc()

    async def start(self):
        self.events.append(("start", self.name))

    async def wait_healthy(self, client, timeout):
        await self.ready.wait()
        if self.fail:
            raise ChildFailed(self.fail)

    async def stop(self):
        self.events.append(("stop", self.name))
        self.proc.exited.set()

    def kill_group(self):
        pass

    def failure(self):
        return "exited"


def make_pool(names, models_max, timeout=5.0, fail=None):
    events, ready = [], asyncio.Event()
    ready.set()
    specs = {n: ModelSpec(n, f"/models/{n}") for n in names}
    pool = ModelPool(
        specs,
        lambda spec: FakeChild(spec.name, events, ready, (fail or {}).get(spec.name)),
        models_max,
        timeout,
    )
    return pool, events, ready


def states(pool):
    return {n: m.state for n, m in pool.models.items()}


async def use(pool, name):
    await pool.release(await pool.acquire(name))


def test_lru_idle_model_unloads_beyond_models_max():
    async def main():
        pool, events, _ = make_pool(["a", "b", "c"], models_max=2)
        await use(pool, "a")
        await use(pool, "b")
        await use(pool, "a")  # a is now the most recently used
        await use(pool, "c")
        assert states(pool) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        assert events == [("start", "a"), ("start", "b"), ("stop", "b"), ("start", "c")]
        with pytest.raises(UnknownModel):
            await pool.acquire("d")
        await pool.close()

    asyncio.run(main())


def test_one_load_for_many_waiters():
    async def main():
        pool, events, ready = make_pool(["a"], models_max=1)
        ready.clear()
        waiters = [asyncio.ensure_future(pool.acquire("a")) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert states(pool) == {"a": "loading"}
        ready.set()
        got = await asyncio.gather(*waiters)
        assert {id(m) for m in got} == {id(pool.models["a"])}
        assert pool.models["a"].in_flight == 5 and pool.models["a"].loads == 1
        assert events == [("start", "a")]
        await pool.close()

    asyncio.run(main())


def test_busy_model_drains_and_never_unloads_under_its_requests():
    async def main():
        pool, events, _ = make_pool(["a", "b"], models_max=1)
        held = await pool.acquire("a")
        want_b = asyncio.ensure_future(pool.acquire("b"))
        await asyncio.sleep(0.05)
        # b waits for room: a drains (no new request takes it) but keeps serving its own.
        assert not want_b.done() and pool.models["a"].draining
        assert states(pool) == {"a": "loaded", "b": "unloaded"}
        late_a = asyncio.ensure_future(pool.acquire("a"))
        await asyncio.sleep(0.05)
        assert not late_a.done() and ("stop", "a") not in events
        await pool.release(held)  # a's last request ends: a unloads, b loads
        b = await want_b
        assert states(pool) == {"a": "unloaded", "b": "loaded"}
        assert events == [("start", "a"), ("stop", "a"), ("start", "b")]
        await pool.release(b)  # now a, waiting all along, gets its turn back
        await pool.release(await late_a)
        assert states(pool) == {"a": "loaded", "b": "unloaded"}
        await pool.close()
        assert events[-1] == ("stop", "a")

    asyncio.run(main())


def test_the_requests_a_model_loaded_for_get_it_before_it_drains():
    async def main():
        pool, events, ready = make_pool(["a", "b"], models_max=1)
        ready.clear()
        a1 = asyncio.ensure_future(pool.acquire("a"))  # starts a's load
        await asyncio.sleep(0.01)
        bs = [asyncio.ensure_future(pool.acquire("b")) for _ in range(2)]
        await asyncio.sleep(0.01)
        a2 = asyncio.ensure_future(pool.acquire("a"))
        await asyncio.sleep(0.01)
        ready.set()  # a loads; b's waiters drain it, but a2 was waiting for this load too
        held = [await a1, await a2]
        assert pool.models["a"].draining and pool.models["a"].in_flight == 2
        late_a = asyncio.ensure_future(pool.acquire("a"))  # came after the drain: next turn
        for m in held:
            await pool.release(m)
        for m in await asyncio.gather(*bs):
            await pool.release(m)
        await pool.release(await late_a)
        assert events == [
            ("start", "a"),
            ("stop", "a"),
            ("start", "b"),
            ("stop", "b"),
            ("start", "a"),
        ]
        await pool.close()

    asyncio.run(main())


def test_failed_load_names_the_reason_and_the_next_request_retries():
    async def main():
        pool, events, _ = make_pool(["a"], models_max=1, fail={"a": "quantization: bad value"})
        with pytest.raises(ModelUnavailable, match="failed to load: quantization: bad value"):
            await pool.acquire("a")
        assert states(pool) == {"a": "failed"}
        assert pool.models["a"].as_dict()["error"] == "quantization: bad value"
        with pytest.raises(ModelUnavailable):
            await pool.acquire("a")
        assert pool.models["a"].loads == 2
        await pool.close()

    asyncio.run(main())


def test_wait_is_bounded_by_the_load_timeout():
    async def main():
        pool, _, ready = make_pool(["a"], models_max=1, timeout=0.3)
        ready.clear()  # the child never becomes healthy
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ModelUnavailable, match="--model-load-timeout; it is loading"):
            await pool.acquire("a")
        assert 0.25 < loop.time() - start < 2.0
        await pool.close()
        assert states(pool) == {"a": "unloaded"}

    asyncio.run(main())
