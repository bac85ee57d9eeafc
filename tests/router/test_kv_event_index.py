"""The router's KV-event view (router/kv_index.py, kv_events.py) against a real radix tree
publishing through the real ZMQ publisher: batches missed before the router subscribed are
replayed from the worker's replay socket; without one the worker's view is unsynced (the policy
routes it on the text tree) until its cache is cleared; a publisher that starts again (a worker
restarted) clears the view; a worker without a publisher is routed on the text tree. Each view is
checked against the tree's own blocks (SGLang's hashes, tests/scheduler/test_kv_events.py)."""

from __future__ import annotations

import time

import pytest
import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.kv_event_publisher import ZmqEventPublisher
from radixlm.cache.kv_events_config import KVEventsConfig
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.radix_cache import RadixCache
from radixlm.router.kv_events import KvEventSubscriber, subscriber_endpoints
from radixlm.router.kv_index import KvEventIndex
from radixlm.router.policies import CacheAwarePolicy
from radixlm.router.routing_text import routing_text
from tests.scheduler.test_kv_events import chain, tree_blocks

W, OTHER = "http://worker-a:1", "http://worker-b:1"


class Worker:
    """A radix tree whose every change goes out as one published batch (a scheduler step)."""

    def __init__(self, endpoint: str, replay: str | None = None):
        self.pool = TokenToKVPool(400, 1, 1, 4, torch.float32, "cpu")
        self.tree = RadixCache(self.pool)
        config = KVEventsConfig(publisher="zmq", endpoint=endpoint, replay_endpoint=replay)
        self.publisher = ZmqEventPublisher(config)
        self.tree.set_kv_events(self.publisher.sink)

    def insert(self, ids: list[int]) -> None:
        slots = self.pool.alloc(len(ids))
        self.pool.free(slots[: self.tree.insert(PrefixKey(ids), slots)])
        self.publisher.after_step()

    def flush(self) -> None:
        self.tree.reset()
        self.publisher.after_step()


@pytest.fixture
def router_side():
    index = KvEventIndex()
    sub = KvEventSubscriber(index)
    yield index, sub
    sub.shutdown()


def wait_seq(index: KvEventIndex, worker: str, seq: int) -> None:
    deadline = time.monotonic() + 5
    while index.view(worker).seq != seq:
        assert time.monotonic() < deadline, index.stats()
        time.sleep(0.02)


def prompts(n: int, length: int = 30) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [torch.randint(100, 4000, (length,), generator=g).tolist() for _ in range(n)]


def test_missed_batches_are_replayed(tmp_path, router_side):
    index, sub = router_side
    w = Worker(f"ipc://{tmp_path / 'pub'}", f"ipc://{tmp_path / 'replay'}")
    p, q, s = prompts(3)
    w.insert(p)
    w.insert(q)  # batches 0 and 1: out before the router subscribed
    time.sleep(0.2)
    sub.subscribe(W, (f"ipc://{tmp_path / 'pub'}", "", f"ipc://{tmp_path / 'replay'}"))
    time.sleep(1.0)  # the subscription takes hold (ZMQ's slow joiner; a loaded machine)
    w.insert(s)  # batch 2: the first the router sees, after a gap it fills by replay
    wait_seq(index, W, 2)
    view = index.view(W)
    assert view.synced and view.gaps == 0 and view.batches == 3
    assert view.blocks == set(tree_blocks(w.tree))
    assert index.matched_tokens(p + [1, 2], [W]) == {W: len(p)}
    w.publisher.shutdown()


def test_unreplayable_gap_falls_back_to_the_text_tree_until_cleared(tmp_path, router_side):
    index, sub = router_side
    endpoint = f"ipc://{tmp_path / 'pub'}"
    w = Worker(endpoint)  # no replay socket
    p, q = prompts(2)
    w.insert(p)
    time.sleep(0.2)
    sub.subscribe(W, (endpoint, "", None))
    time.sleep(1.0)
    w.insert(q)
    wait_seq(index, W, 1)
    assert not index.view(W).synced and index.view(W).gaps == 1
    # The worker holds p, but its view is incomplete: the policy does not trust it, and the text
    # tree (which has seen nothing) decides: a miss, the first listed.
    policy = CacheAwarePolicy(kv_index=index)
    body = {"input_ids": p + [7]}
    assert index.matched_tokens(p + [7], [OTHER, W]) == {}
    assert policy.select([OTHER, W], {}, routing_text("/generate", body), p + [7]) == OTHER
    # A flush clears the worker's cache: its view is complete again from there.
    w.flush()
    w.insert(p)
    wait_seq(index, W, 3)
    assert index.view(W).synced and index.view(W).blocks == set(tree_blocks(w.tree))
    policy = CacheAwarePolicy(kv_index=index)  # (the first one's text tree now has p on OTHER)
    assert policy.select([OTHER, W], {}, routing_text("/generate", body), p + [7]) == W
    assert policy.kv_events_hits == 1
    w.publisher.shutdown()


def test_a_restarted_publisher_clears_the_view(tmp_path, router_side):
    index, sub = router_side
    endpoint = f"ipc://{tmp_path / 'pub'}"
    w = Worker(endpoint)
    sub.subscribe(W, (endpoint, "", None))
    time.sleep(1.0)
    p, q, s = prompts(3)
    w.insert(p)
    w.insert(q)
    wait_seq(index, W, 1)
    assert set(chain(p)) <= index.view(W).blocks
    # Found down by a health check, then its next batch: the same publisher, the view resumes.
    policy = CacheAwarePolicy(kv_index=index)
    policy.remove_worker(W)
    assert not index.synced(W) and index.matched_tokens(p, [W]) == {}
    w.insert(q + [9])
    wait_seq(index, W, 2)
    assert index.synced(W) and index.view(W).blocks == set(tree_blocks(w.tree))
    policy.remove_worker(W)  # down again: this time it restarts, a new tree and seq 0
    w.publisher.shutdown()
    time.sleep(0.05)
    w2 = Worker(endpoint)
    time.sleep(1.0)  # the router's socket reconnects to the new one
    assert not index.synced(W)  # nothing heard yet: its old blocks are not trusted
    w2.insert(s)
    wait_seq(index, W, 0)
    view = index.view(W)
    assert view.restarts == 1 and view.synced and view.gaps == 0
    assert view.blocks == set(tree_blocks(w2.tree)) == set(chain(s))
    assert index.matched_tokens(p, [W]) == {W: 0}
    w2.publisher.shutdown()


def test_worker_without_events_is_routed_on_the_text_tree():
    index = KvEventIndex()
    index.view(W)  # W publishes (its view, empty so far); OTHER does not
    policy = CacheAwarePolicy(kv_index=index)
    text = "a shared document " * 10
    policy.tree.insert(text, OTHER)  # the router sent it there before
    assert index.matched_tokens([5, 6, 7], [W, OTHER]) == {W: 0}
    assert policy.select([W, OTHER], {}, text + "?", [5, 6, 7]) == OTHER
    # Where the worker's publisher is, from its /get_server_info.
    none = {"kv_events_config": None}
    assert subscriber_endpoints("http://h:30001", none) is None
    off = {"kv_events_config": '{"publisher": "null"}'}
    assert subscriber_endpoints("http://h:30001", off) is None
    on = {"kv_events_config": '{"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "t"}'}
    assert subscriber_endpoints("http://10.0.0.7:30001", on) == ("tcp://10.0.0.7:5557", "t", None)
