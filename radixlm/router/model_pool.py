"""Which models are loaded: each one's state, its child server and its requests in flight.

A request takes its model with `acquire` and gives it back with `release`. A model that is not
loaded loads on first use; beyond --models-max loaded (or loading) models the least recently used
idle one unloads first. A model with requests in flight never unloads under them: when every
loaded model is busy, the least recently used one is marked draining (it takes no new request and
unloads once its last one ends), so a model waiting for room is not starved by a busy one.
Requests for a model that is loading (or waiting for room) wait, up to --model-load-timeout; the
models load in the order their requests came.

States: unloaded -> loading -> loaded -> unloading -> unloaded; a load that fails leaves `failed`
(with the reason; the next request tries again)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from radixlm.router.model_catalog import ModelSpec
from radixlm.router.model_child import ChildFailed, ModelChild

logger = logging.getLogger(__name__)

UNLOADED, LOADING, LOADED, UNLOADING, FAILED = (
    "unloaded",
    "loading",
    "loaded",
    "unloading",
    "failed",
)


class UnknownModel(LookupError):
    pass


class ModelUnavailable(Exception):
    """The model could not be had: its load failed or the wait ran past the timeout."""


@dataclass
class PooledModel:
    spec: ModelSpec
    state: str = UNLOADED
    child: ModelChild | None = None
    in_flight: int = 0
    last_used: float = 0.0
    draining: bool = False
    waiters: set = field(default_factory=set)  # the requests waiting for this model
    # While draining: the requests that were already waiting when the drain began; they still get
    # the model (it may have just loaded for them), later ones wait for its next load.
    admitted: set = field(default_factory=set)
    error: str | None = None
    loads: int = 0  # how many times it was started
    load_started: float = 0.0
    tasks: set = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def occupies_slot(self) -> bool:
        return self.state in (LOADING, LOADED, UNLOADING)

    def as_dict(self) -> dict:
        d = {
            "value": self.state,
            "in_flight": self.in_flight,
            "loads": self.loads,
            "draining": self.draining,
        }
        if self.child is not None and self.state in (LOADING, LOADED):
            d["pid"] = self.child.pid
        if self.state == LOADING:
            d["loading_seconds"] = round(time.monotonic() - self.load_started, 1)
        if self.state == FAILED:
            d["error"] = self.error
        return d


class ModelPool:
    def __init__(
        self,
        specs: dict[str, ModelSpec],
        make_child: Callable[[ModelSpec], ModelChild],
        models_max: int,
        load_timeout: float,
    ):
        if models_max < 1:
            raise ValueError(f"models_max must be >= 1, got {models_max}")
        if not load_timeout > 0:
            raise ValueError(f"model_load_timeout must be > 0, got {load_timeout}")
        self.models = {name: PooledModel(spec) for name, spec in specs.items()}
        self.make_child = make_child
        self.models_max = models_max
        self.load_timeout = load_timeout
        self.client: httpx.AsyncClient | None = None  # for the children's /health
        self._changed = asyncio.Condition()
        self._closing = False
        # Every waiting request -> its model, oldest first: loads go in this order (a request that
        # came later does not take the next free slot from one that has waited longer).
        self._queue: dict[object, PooledModel] = {}

    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str) -> PooledModel:
        m = self.models.get(name)
        if m is None:
            raise UnknownModel(name)
        return m

    async def acquire(self, name: str) -> PooledModel:
        """The model, loaded, with this request counted in flight (give it back with release)."""
        m = self.get(name)
        deadline = time.monotonic() + self.load_timeout
        tried = False  # a failure seen after this request's own try ends it
        me = object()
        async with self._changed:
            m.waiters.add(me)
            self._queue[me] = m
            try:
                while True:
                    if self._closing:
                        raise ModelUnavailable("the server is shutting down")
                    if m.state == LOADED and (not m.draining or me in m.admitted):
                        m.admitted.discard(me)
                        m.in_flight += 1
                        m.last_used = time.monotonic()
                        return m
                    if m.state == FAILED and tried:
                        raise ModelUnavailable(f"model {name!r} failed to load: {m.error}")
                    if m is self._next_to_load() and self._make_room(m):
                        self._begin_load(m)
                    tried = tried or m.state == LOADING
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ModelUnavailable(
                            f"model {name!r} is not loaded after {self.load_timeout:g} s"
                            f" (--model-load-timeout; it is {m.state})"
                        )
                    try:
                        await asyncio.wait_for(self._changed.wait(), left)
                    except TimeoutError:
                        pass
            finally:
                m.waiters.discard(me)
                del self._queue[me]
                if me in m.admitted:  # gone without its turn (timed out, or its client left)
                    m.admitted.discard(me)
                    self._unload_if_drained(m)
                self._changed.notify_all()  # the next in line may be the one to load now

    async def release(self, m: PooledModel) -> None:
        async with self._changed:
            m.in_flight -= 1
            m.last_used = time.monotonic()
            self._unload_if_drained(m)
            self._changed.notify_all()

    def _next_to_load(self) -> PooledModel | None:
        """The model of the longest-waiting request whose model is not loaded nor loading."""
        return next((m for m in self._queue.values() if m.state in (UNLOADED, FAILED)), None)

    def _unload_if_drained(self, m: PooledModel) -> None:
        if m.state == LOADED and m.draining and m.in_flight == 0 and not m.admitted:
            self._begin_unload(m, "drained")

    def _make_room(self, wanted: PooledModel) -> bool:
        """True when `wanted` may start loading now; else an unload (of the least recently used
        idle model) or a drain (of the least recently used busy one) is under way or impossible
        yet, and the caller waits. Called with the condition held."""
        used = [m for m in self.models.values() if m.occupies_slot]
        if len(used) < self.models_max:
            return True
        if any(m.state == UNLOADING or m.draining for m in used):
            return False  # room is on its way
        loaded = sorted((m for m in used if m.state == LOADED), key=lambda m: m.last_used)
        if not loaded:
            return False  # every slot is loading: wait for one to finish
        # Idle: nothing in flight and nobody waiting (a model that has just loaded for its waiters
        # is not idle yet).
        idle = [m for m in loaded if m.in_flight == 0 and not m.waiters]
        victim = (idle or loaded)[0]
        if idle:
            self._begin_unload(victim, f"least recently used; room for {wanted.name}")
        else:
            victim.draining, victim.admitted = True, set(victim.waiters)
            logger.info(
                "model %s draining (%d request(s) in flight, %d waiting) to make room for %s",
                victim.name,
                victim.in_flight,
                len(victim.admitted),
                wanted.name,
            )
        return False

    def _spawn(self, m: PooledModel, coro) -> None:
        task = asyncio.ensure_future(coro)
        m.tasks.add(task)
        task.add_done_callback(m.tasks.discard)

    # The state changes at once, with the condition held (a second waiter must not start the
    # same load, nor take a model that is about to unload); the process work follows in a task.
    def _begin_load(self, m: PooledModel) -> None:
        m.state, m.error, m.load_started = LOADING, None, time.monotonic()
        m.loads += 1
        m.child = self.make_child(m.spec)
        self._spawn(m, self._load(m, m.child))

    def _begin_unload(self, m: PooledModel, why: str) -> None:
        m.state, m.draining, m.admitted = UNLOADING, False, set()
        self._spawn(m, self._unload(m, why))

    async def _load(self, m: PooledModel, child: ModelChild) -> None:
        logger.info("loading model %s (%s) on port %d", m.name, m.spec.path, child.port)
        try:
            await child.start()
            await child.wait_healthy(self.client, self.load_timeout)
        except (ChildFailed, OSError) as e:
            logger.error("model %s failed to load: %s", m.name, e)
            await child.stop()
            async with self._changed:
                m.state, m.error, m.child = FAILED, str(e), None
                self._changed.notify_all()
            return
        logger.info("model %s loaded in %.1f s", m.name, time.monotonic() - m.load_started)
        async with self._changed:
            m.state = LOADED
            m.last_used = time.monotonic()
            self._spawn(m, self._watch(m, child))
            self._changed.notify_all()

    async def _watch(self, m: PooledModel, child: ModelChild) -> None:
        """A loaded model whose server exits on its own (a crash) becomes failed; its requests
        in flight fail with their connection."""
        await child.proc.wait()
        async with self._changed:
            if m.child is child and m.state == LOADED:
                m.state, m.child, m.draining, m.admitted = FAILED, None, False, set()
                m.error = child.failure()
                logger.error("model %s: %s", m.name, m.error)
                child.kill_group()
                self._changed.notify_all()

    async def _unload(self, m: PooledModel, why: str) -> None:
        child = m.child
        logger.info("unloading model %s (%s)", m.name, why)
        if child is not None:
            await child.stop()
        async with self._changed:
            m.state, m.child = UNLOADED, None
            self._changed.notify_all()
        logger.info("model %s unloaded", m.name)

    async def load(self, name: str) -> None:
        """POST /models/load: load it now (in the background), as a request would."""
        m = self.get(name)

        async def use_once():
            try:
                await self.release(await self.acquire(name))
            except ModelUnavailable as e:
                logger.error("%s", e)

        self._spawn(m, use_once())

    async def unload(self, name: str) -> str:
        """POST /models/unload: now when idle, else once its requests end (draining)."""
        m = self.get(name)
        async with self._changed:
            if m.state != LOADED:
                return m.state
            if m.in_flight:
                m.draining, m.admitted = True, set()
                return "draining"
            self._begin_unload(m, "asked")
            return UNLOADING

    async def close(self) -> None:
        """Every child stopped (the server is shutting down)."""
        self._closing = True
        async with self._changed:
            self._changed.notify_all()
        for m in self.models.values():
            for t in list(m.tasks):
                t.cancel()
        children = [m.child for m in self.models.values() if m.child is not None]
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        for m in self.models.values():
            m.child, m.state = None, UNLOADED

    def kill_all(self) -> None:
        """The last resort at exit (sync): SIGKILL to every child's group still there."""
        for m in self.models.values():
            if m.child is not None:
                m.child.kill_group()
