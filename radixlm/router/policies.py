"""Which worker a request goes to. A policy sees the healthy workers, the router's own count of
in-flight requests per worker (its load) and the request's routing text (for chat: the whole
rendered conversation, not its first message), and names one worker.

cache_aware is SGLang's router policy with its fixes: when the load is imbalanced
(max - min > balance_abs_threshold and max > min x balance_rel_threshold) the least loaded worker;
otherwise the worker holding the longest cached prefix if it covers more than cache_threshold of
the text, else the least loaded worker (not the one with the smallest tree: that sends every miss
to a worker that may be overloaded). The chosen worker then becomes a tenant of the text.

With a KvEventIndex (`radixlm router --kv-events`: kv_index.py, fed by the workers' KV events) and
the request's token ids, a worker whose events are in sync is matched on what its cache holds
(tokens of the request's chain of block hashes) instead of on the text the router sent it; the
others (no publisher, events missed) on the text tree as before. Each worker's share is its own
match over the request's length; the best share above cache_threshold wins, load breaking ties.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from radixlm.registry import Registry
from radixlm.router.kv_index import KvEventIndex
from radixlm.router.tree import ApproxRadixTree


@dataclass
class CacheAwareConfig:
    cache_threshold: float = 0.5  # share of the text that must be cached on a worker to follow it
    balance_abs_threshold: int = 32  # in-flight requests of difference before load wins ...
    balance_rel_threshold: float = 1.5  # ... and this ratio of max to min as well
    eviction_interval_secs: float = 60.0  # how often the tree is trimmed
    max_tree_size: int = 2**24  # characters per worker kept in the tree

    def __post_init__(self):
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1")
        if self.max_tree_size < 1 or self.eviction_interval_secs <= 0:
            raise ValueError("max_tree_size and eviction_interval_secs must be positive")


def least_loaded(workers: list[str], loads: dict[str, int]) -> str:
    """The worker with the fewest in-flight requests (the first listed on a tie)."""
    return min(workers, key=lambda w: loads.get(w, 0))


class Policy:
    name = ""

    @classmethod
    def create(cls, config: CacheAwareConfig | None, seed: int | None) -> Policy:
        """make_policy's constructor: from the cache-aware options and the random seed (each
        policy takes what it uses)."""
        return cls()

    def select(
        self,
        workers: list[str],
        loads: dict[str, int],
        text: str,
        tokens: list[int] | None = None,
    ) -> str:
        """`tokens`: the request's token ids where the router knows them (for --kv-events)."""
        raise NotImplementedError

    def remove_worker(self, worker: str) -> None:
        """A worker left (removed, or found dead): forget what the policy knew of it."""

    def maintain(self) -> None:
        """Periodic upkeep (the router calls it every few seconds)."""


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self):
        self._next = 0
        self._lock = threading.Lock()

    def select(self, workers, loads, text, tokens=None):
        with self._lock:
            w = workers[self._next % len(workers)]
            self._next += 1
        return w


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, seed: int | None = None):
        self._rng = random.Random(seed)

    @classmethod
    def create(cls, config, seed):
        return cls(seed)

    def select(self, workers, loads, text, tokens=None):
        return self._rng.choice(workers)


class PowerOfTwoPolicy(Policy):
    """Two workers drawn at random, the less loaded one taken."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None):
        self._rng = random.Random(seed)

    @classmethod
    def create(cls, config, seed):
        return cls(seed)

    def select(self, workers, loads, text, tokens=None):
        if len(workers) == 1:
            return workers[0]
        a, b = self._rng.sample(workers, 2)
        return a if loads.get(a, 0) <= loads.get(b, 0) else b


class CacheAwarePolicy(Policy):
    name = "cache_aware"

    def __init__(
        self,
        config: CacheAwareConfig | None = None,
        clock=None,
        kv_index: KvEventIndex | None = None,
    ):
        self.config = config or CacheAwareConfig()
        self.tree = ApproxRadixTree()
        self.kv_index = kv_index
        self._lock = threading.Lock()
        self._clock = clock or time.monotonic
        self._last_eviction = self._clock()
        self.decisions = {"imbalanced": 0, "cache_hit": 0, "cache_miss": 0}
        self.kv_events_hits = 0  # of the cache hits, those the workers' events decided

    @classmethod
    def create(cls, config, seed):
        return cls(config)

    def is_imbalanced(self, workers: list[str], loads: dict[str, int]) -> bool:
        ls = [loads.get(w, 0) for w in workers]
        hi, lo = max(ls), min(ls)
        return (
            hi - lo > self.config.balance_abs_threshold
            and hi > lo * self.config.balance_rel_threshold
        )

    def select(self, workers, loads, text, tokens=None):
        with self._lock:
            if self.is_imbalanced(workers, loads):
                choice, kind = least_loaded(workers, loads), "imbalanced"
            else:
                shares, by_events = self._shares(workers, text, tokens)
                best = max(shares.values(), default=0.0)
                if best > self.config.cache_threshold:
                    holders = [w for w in workers if shares.get(w) == best]
                    choice, kind = least_loaded(holders, loads), "cache_hit"
                    self.kv_events_hits += choice in by_events
                else:
                    choice, kind = least_loaded(workers, loads), "cache_miss"
            self.decisions[kind] += 1
            self.tree.insert(text, choice, self._clock())
            return choice

    def _shares(
        self, workers: list[str], text: str, tokens: list[int] | None
    ) -> tuple[dict[str, float], set[str]]:
        """Each worker's cached share of the request, and the workers whose share came from
        their events."""
        matched = {}
        if self.kv_index is not None and tokens:
            matched = self.kv_index.matched_tokens(tokens, workers)
        shares = {w: n / len(tokens) for w, n in matched.items()}
        rest = [w for w in workers if w not in matched]
        if rest and text:
            chars, tenants = self.tree.prefix_match(text, self._clock())
            deepest = [w for w in rest if w in tenants]
            for w in deepest:
                shares[w] = chars / len(text)
            if chars and not deepest:  # the deepest match is elsewhere: how far each one goes
                for w in rest:
                    shares[w] = self.tree.prefix_match_tenant(text, w) / len(text)
        return shares, set(matched)

    def remove_worker(self, worker):
        with self._lock:
            self.tree.remove_tenant(worker)
        if self.kv_index is not None:
            self.kv_index.suspect(worker)

    def maintain(self):
        now = self._clock()
        if now - self._last_eviction < self.config.eviction_interval_secs:
            return
        self._last_eviction = now
        with self._lock:
            self.tree.evict_tenant_by_size(self.config.max_tree_size)


# --policy (and --prefill-policy / --decode-policy), its choices in this order.
ROUTER_POLICY_REGISTRY = Registry[type[Policy], None](
    "router policy", unknown="policy must be one of {names}, got {name!r}"
)
ROUTER_POLICY_REGISTRY.register("cache_aware", CacheAwarePolicy)
ROUTER_POLICY_REGISTRY.register("round_robin", RoundRobinPolicy)
ROUTER_POLICY_REGISTRY.register("random", RandomPolicy)
ROUTER_POLICY_REGISTRY.register("power_of_two", PowerOfTwoPolicy)


def make_policy(
    name: str, config: CacheAwareConfig | None = None, seed: int | None = None
) -> Policy:
    return ROUTER_POLICY_REGISTRY.get(name).create(config, seed)
