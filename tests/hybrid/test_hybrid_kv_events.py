"""KV events of a hybrid model (tiny Qwen3.5: Gated DeltaNet state layers beside attention): the
tree's state snapshots are published as blocks of medium GPU_STATE (cache/kv_events.py), and a
subscriber written against SGLang's schema (tests/scheduler/test_kv_events.py's) receives exactly
the snapshots the tree holds after each step: prompts sharing a prefix (snapshots every 32 prompt
tokens), snapshot eviction through a small state pool (BlockRemoved GPU_STATE), a flush. The
router's view fed by the same publisher (router/kv_events.py) matches a request exactly as far as
the scheduler's own match_prefix reuses it: to the deepest snapshot, not to the end of the KV."""

from __future__ import annotations

import time

import msgspec
import pytest
import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.kv_block_hash import block_hashes
from radixlm.router.kv_events import KvEventSubscriber
from radixlm.router.kv_index import KvEventIndex
from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler
from tests.scheduler.test_kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Subscriber,
    get_hash_str,
    hash_str_to_int64,
    tree_blocks,
)

W = "http://hybrid-worker:1"
POOL = dict(
    max_total_tokens=2048,
    max_mamba_cache_size=10,  # 10 state slots: a few requests' rows, the rest snapshots
    chunked_prefill_size=64,
    mamba_track_interval=32,
    max_running_requests=2,
)


def tree_snapshots(tree, held=lambda n: n.snapshot.slot is not None) -> set[int]:
    """The block hashes (SGLang's) of the tokens the tree's snapshots end at (device ones, or
    where held)."""
    out = set()
    stack = [(c, None) for c in tree.root_node.children.values()]
    while stack:
        node, prior = stack.pop()
        for t in node.key:
            prior = get_hash_str([t], prior)
        if held(node):
            out.add(hash_str_to_int64(prior))
        stack.extend((c, prior) for c in node.children.values())
    return out


@pytest.fixture(scope="module")
def published(hybrid_checkpoint_dir, tmp_path_factory):
    endpoint = f"ipc://{tmp_path_factory.mktemp('kv-hybrid') / 'events'}"
    config = f'{{"publisher": "zmq", "endpoint": "{endpoint}", "topic": "kv@hybrid"}}'
    d = Driver(make_scheduler(hybrid_checkpoint_dir("qwen35"), kv_events_config=config, **POOL))
    sub = Subscriber(endpoint, "kv@hybrid")
    index = KvEventIndex()
    router = KvEventSubscriber(index)
    router.subscribe(W, (endpoint, "kv@hybrid", None))
    time.sleep(1.0)  # both subscriptions take hold (ZMQ's slow joiner)
    yield d, sub, index
    router.shutdown()
    d.s.kv_events.shutdown()
    sub.sock.close(linger=0)


def settle(d, sub: Subscriber, index: KvEventIndex) -> list:
    """The events of the steps so far, once the router's view has them too; checked against the
    tree: its KV blocks and its snapshots, per medium."""
    events = sub.drain()
    deadline = time.monotonic() + 5
    while index.view(W).seq != sub.seq:
        assert time.monotonic() < deadline, (index.stats(), sub.seq)
        time.sleep(0.02)
    tree = d.s.tree_cache
    assert sub.mirror.live("GPU") == tree_blocks(tree)
    assert set(sub.mirror.live("GPU_STATE")) == tree_snapshots(tree)
    assert index.view(W).states == tree_snapshots(tree) and index.synced(W)
    return events


def run(d: Driver, ids: list[int], n: int = 3) -> None:
    d.submit(ids, max_new_tokens=n, temperature=0, ignore_eos=True)
    d.run()


def reused(d, ids: list[int]) -> int:
    """How much of ids the scheduler's own match would reuse (nothing moves)."""
    return len(d.s.tree_cache.peek_prefix(PrefixKey(ids)).indices)


def test_snapshots_are_published_and_routed_on(published):
    d, sub, index = published
    g = torch.Generator().manual_seed(0)

    def tokens(n):
        return torch.randint(10, 200, (n,), generator=g).tolist()

    doc = tokens(100)
    run(d, doc + tokens(10))
    events = settle(d, sub, index)
    states = [e for e in events if isinstance(e, BlockStored) and e.medium == "GPU_STATE"]
    assert len(states) >= 3  # a snapshot every 32 prompt tokens, and where the prompt ended

    # A prompt sharing doc and diverging at 90: the KV run is 90 tokens, the reusable prefix the
    # deepest snapshot within it (at 64). The router's match is the scheduler's.
    branch = doc[:90] + [5] + tokens(19)  # 5: no prompt's token (they are 10..199)
    chain, view = block_hashes(branch), index.view(W)
    assert all(h in view.blocks for h in chain[:90]) and chain[90] not in view.blocks
    want = reused(d, branch)
    assert 0 < want < 90 and index.matched_tokens(branch, [W]) == {W: want}
    run(d, branch)
    settle(d, sub, index)

    # Snapshot eviction: more prompts than the 10 state slots hold snapshots for.
    removed = []
    for _ in range(4):
        run(d, tokens(70))
        removed += [
            e
            for e in settle(d, sub, index)
            if isinstance(e, BlockRemoved) and e.medium == "GPU_STATE"
        ]
    assert removed
    for ids in (doc + tokens(5), branch + tokens(5)):
        assert index.matched_tokens(ids, [W]) == {W: reused(d, ids)}

    # A flush: one AllBlocksCleared, the view empty of blocks and snapshots.
    assert d.s.flush_cache().success
    d.step()
    assert [type(e) for e in sub.drain()] == [AllBlocksCleared]
    deadline = time.monotonic() + 5
    while index.view(W).seq != sub.seq:
        assert time.monotonic() < deadline, index.stats()
        time.sleep(0.02)
    assert sub.mirror.blocks == {}
    assert index.view(W).states == set() and index.view(W).blocks == set()
    assert_idle_memory_ok(d.s)


def test_host_snapshot_moves_are_per_medium_events():
    """The hierarchical cache of a hybrid: a device snapshot moved to the host (GPU_STATE removed,
    CPU_PINNED_STATE stored), loaded back by a match (GPU_STATE stored), its host copy dropped
    (CPU_PINNED_STATE removed); each medium's view equals the tree's snapshots after every move."""
    from radixlm import kv_event_schema
    from radixlm.cache.kv_events import KVEventRecorder
    from tests.scheduler.test_kv_events import KVEventBatch, Mirror
    from tests.unit.test_hi_mamba_radix_cache import K, forward, insert, make, snapshot

    tree, kv_pool, states = make(snapshots=2, host_states=8)
    rec, mirror = KVEventRecorder(), Mirror()
    tree.set_kv_events(rec)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(type=KVEventBatch)

    def sync():
        batch = kv_event_schema.KVEventBatch(ts=time.time(), events=rec.take())
        mirror.apply(dec.decode(enc.encode(batch)))
        assert mirror.live("GPU") == tree_blocks(tree)
        assert set(mirror.live("GPU_STATE")) == tree_snapshots(tree)
        host = tree_snapshots(tree, lambda n: n.snapshot.host_slot is not None)
        assert set(mirror.live("CPU_PINNED_STATE")) == host
        return host

    a, b = list(range(10, 30)), list(range(10, 20)) + list(range(50, 60))
    for ids in (a, b):
        insert(tree, kv_pool, ids)
        snapshot(tree, states, ids, float(ids[-1]))
    sync()
    assert len(mirror.live("GPU_STATE")) == 2 and not mirror.live("CPU_PINNED_STATE")
    assert tree.evict_states(1, False) == 1  # one device snapshot down to the host
    forward(states)
    assert len(sync()) == 1 and len(mirror.live("GPU_STATE")) == 1
    for ids in (a, b):  # the one on the host comes back to the device with its match
        assert len(tree.match_prefix(K(ids)).indices) == len(ids)
        forward(states)
        sync()
    assert tree.host_snapshots.evict_host_states(8) >= 1  # host copies dropped
    assert sync() == set() and len(mirror.live("GPU_STATE")) == 2
