"""`radixlm router --kv-events` in front of two tiny-model servers that publish KV events
(--kv-events-config) and one that does not: the router routes on what the workers' caches hold,
as their events say, where its text tree would guess otherwise. The test subscribes to the same
publishers with SGLang's schema (tests/scheduler/test_kv_events.py's subscriber) and checks each
step against the events actually received: a prompt prefilled on worker A directly draws a
request sharing it to A (ids and text), a flush of A (AllBlocksCleared) and an eviction on A
(BlockRemoved) send it where the blocks still are."""

from __future__ import annotations

import json
import sys
import time

import pytest
import requests
import torch
from prometheus_client.parser import text_string_to_metric_families

from radixlm.router.policies import CacheAwarePolicy
from radixlm.router.routing_text import routing_text
from radixlm.server.process import ServerProcess
from tests.scheduler.test_kv_events import AllBlocksCleared, BlockRemoved, Subscriber, chain

A_POOL = 900  # worker A's KV tokens: a few prompts evict older ones


def worker(model_dir, config: dict | None, *extra: str) -> ServerProcess:
    events = ("--kv-events-config", json.dumps(config)) if config else ()
    return ServerProcess("--model-path", model_dir, "--num-threads", "1", *events, *extra)


def router(urls: list[str]) -> ServerProcess:
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
            "--kv-events",
            "--log-level",
            "warning",
        ]

    return ServerProcess(command=cmd, name="the router")


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("kv-router")
    a_cfg = {
        "publisher": "zmq",
        "endpoint": f"ipc://{d / 'a'}",
        "replay_endpoint": f"ipc://{d / 'a-replay'}",
        "topic": "kv@a",
    }
    b_cfg = {"publisher": "zmq", "endpoint": f"ipc://{d / 'b'}", "topic": "kv@b"}
    a = worker(tiny_model_dir, a_cfg, "--max-total-tokens", str(A_POOL))
    b = worker(tiny_model_dir, b_cfg, "--kv-memory-gb", "0.05")
    subs = {"a": Subscriber(a_cfg["endpoint"], "kv@a"), "b": Subscriber(b_cfg["endpoint"], "kv@b")}
    c = worker(tiny_model_dir, None, "--kv-memory-gb", "0.05")  # publishes nothing
    # B first: with nothing known, cache_aware's tie (least loaded, first listed) is B.
    r = router([b.url, a.url, c.url])
    time.sleep(1.0)  # ZMQ's slow joiner: the router's and the test's subscriptions take hold
    r.endpoints = {a.url: a_cfg["endpoint"], b.url: b_cfg["endpoint"], c.url: "none"}
    r.no_events = c.url
    yield r, a, b, subs
    r.stop()
    for w in (a, b, c):
        w.stop()
    for s in subs.values():
        s.sock.close(linger=0)


def post(url: str, path: str, body: dict) -> dict:
    resp = requests.post(url + path, json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def routed(r) -> dict[str, int]:
    workers = requests.get(r.url + "/list_workers", timeout=5).json()["workers"]
    return {w["url"]: w["routed"] for w in workers}


def router_view(r) -> dict:
    return requests.get(r.url + "/get_server_info", timeout=10).json()["router"]


def settle(r, worker, sub: Subscriber) -> list:
    """The events the test's subscriber receives from the worker, once the router has applied
    the same batches (its view's seq is the subscriber's)."""
    events = sub.drain()
    deadline = time.monotonic() + 10
    while router_view(r)["kv_events"][worker.url]["seq"] != sub.seq:
        assert time.monotonic() < deadline, (router_view(r), sub.seq)
        time.sleep(0.05)
    view = router_view(r)["kv_events"][worker.url]
    assert view["synced"] and view["blocks"] == len(sub.mirror.live())
    return events


def via_router(r, body: dict, expect, sub: Subscriber) -> dict:
    """The request through the router: served by `expect` (and its events taken in)."""
    before = routed(r)
    out = post(r.url, "/generate", body)
    after = routed(r)
    assert {u: after[u] - before[u] for u in after} == {u: int(u == expect.url) for u in after}, (
        f"expected {expect.url}"
    )
    settle(r, expect, sub)
    return out


def ids_body(ids: list[int], n: int = 2) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0}}


def test_router_follows_the_workers_kv_events(fleet):
    r, a, b, subs = fleet
    # The router found each worker's publisher through its /get_server_info; C has none: no
    # view, so the policy routes it on the text tree.
    view = router_view(r)["kv_events"]
    assert {u: v["endpoint"] for u, v in view.items()} == r.endpoints
    assert [u for u, v in view.items() if "synced" not in v] == [r.no_events]
    g = torch.Generator().manual_seed(0)
    p = torch.randint(100, 4000, (160,), generator=g).tolist()

    # Stored: P prefilled on A behind the router's back; A's events carry its whole chain.
    post(a.url, "/generate", ids_body(p, 1))
    settle(r, a, subs["a"])
    assert set(chain(p)) <= set(subs["a"].mirror.live())
    req = ids_body(p + [11, 12, 13])
    guess = CacheAwarePolicy().select([b.url, a.url], {}, routing_text("/generate", req), None)
    assert guess == b.url  # the text tree has never seen P: it would pick B
    out = via_router(r, req, a, subs["a"])
    assert out["meta_info"]["cached_tokens"] >= len(p)
    assert router_view(r)["kv_events_hits"] == 1

    # Text: the router has the worker tokenize it, and matches the ids against the events.
    doc = "Rivers carve canyons over long ages, and bridges cross them. " * 8
    post(a.url, "/generate", {"text": doc, "sampling_params": {"max_new_tokens": 1}})
    settle(r, a, subs["a"])
    text_req = {"text": doc + "Why?", "sampling_params": {"max_new_tokens": 2}}
    assert CacheAwarePolicy().select([b.url, a.url], {}, doc + "Why?", None) == b.url
    out = via_router(r, text_req, a, subs["a"])
    assert out["meta_info"]["cached_tokens"] > 0

    # Cleared: A flushed; B now holds P's first 100 tokens. The router's text tree says A (it
    # sent P there), the events say B.
    assert requests.post(a.url + "/flush_cache", timeout=30).status_code == 200
    assert [type(e) for e in settle(r, a, subs["a"])] == [AllBlocksCleared]
    post(b.url, "/generate", ids_body(p[:100], 1))
    settle(r, b, subs["b"])
    assert set(chain(p[:100])) <= set(subs["b"].mirror.live())
    out = via_router(r, ids_body(p[:100] + [21, 22]), b, subs["b"])
    assert out["meta_info"]["cached_tokens"] >= 100

    # Removed: P back on A (160 of P against B's 100: A), then evicted from A's small pool by
    # other prompts (BlockRemoved of P's blocks): B again.
    post(a.url, "/generate", ids_body(p, 1))
    settle(r, a, subs["a"])
    via_router(r, ids_body(p + [31, 32]), a, subs["a"])
    removed = []
    for _ in range(12):
        if chain(p)[-1] not in subs["a"].mirror.live():
            break
        post(a.url, "/generate", ids_body(torch.randint(100, 4000, (200,), generator=g).tolist()))
        removed += [e for e in settle(r, a, subs["a"]) if isinstance(e, BlockRemoved)]
    assert removed and chain(p)[-1] not in subs["a"].mirror.live()
    live_a = set(subs["a"].mirror.live())
    held = sum(1 for h in chain(p) if h in live_a)
    assert held < 100  # what A still holds of P, if anything, is less than B's share
    out = via_router(r, ids_body(p + [41, 42]), b, subs["b"])
    assert out["meta_info"]["cached_tokens"] >= 100
    # Every batch the workers published reached the router in order: no gap, no restart.
    for w in (a, b):
        v = router_view(r)["kv_events"][w.url]
        assert v["gaps"] == 0 and v["restarts"] == 0 and v["synced"]
    # /metrics: the hits the events decided, each worker's live blocks as the subscriber has them.
    samples = {
        (s.name, s.labels.get("worker")): s.value
        for fam in text_string_to_metric_families(requests.get(r.url + "/metrics", timeout=10).text)
        for s in fam.samples
    }
    assert samples[("radixlm_router:kv_events_hits_total", None)] == 5
    for w, sub in ((a, subs["a"]), (b, subs["b"])):
        assert samples[("radixlm_router:kv_events_blocks", w.url)] == len(sub.mirror.live())
