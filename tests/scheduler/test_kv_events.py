"""KV events (--kv-events-config, SGLang's contract): a subscriber written against SGLang's
published schema (its classes written out below from python/sglang/srt/disaggregation/
kv_events.py, 0.5.10) and its block hashing (mem_cache: get_hash_str, hash_str_to_int64) receives,
over a real ZMQ socket, exactly the blocks the radix tree went through: stored for two prompts that
share a prefix (the shared blocks once), cleared by a flush, removed by eviction through a small
pool; the hierarchical cache's moves between L1 and L2 as per-medium events; a malformed
--kv-events-config is a one-line error naming the field."""

from __future__ import annotations

import hashlib
import time
from typing import Any, Optional, Union

import msgspec
import pytest
import torch
import zmq

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.hicache_io import HiCacheStats
from radixlm.cache.hiradix_cache import HiRadixCache
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.kv_events import KVEventRecorder
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.config import ServerArgs
from radixlm.engine.launcher import check_server_args
from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler


# --- SGLang's schema, as SGLang 0.5.10 defines it -------------------------------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None  # noqa: UP045


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]  # noqa: UP045
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]  # noqa: UP045
    medium: Optional[str] = None  # noqa: UP045


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str] = None  # noqa: UP045


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007


def get_hash_str(token_ids: list[int], prior_hash: str | None = None) -> str:
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def hash_str_to_int64(hash_str: str) -> int:
    v = int(hash_str[:16], 16)
    return v - 2**64 if v >= 2**63 else v


# --- the subscriber -------------------------------------------------------------------------
class Mirror:
    """A router's view: the live blocks per medium, built from the events alone. An event that
    contradicts it (a block stored twice, a removed block never stored) fails the test. A state
    snapshot (medium GPU_STATE / CPU_PINNED_STATE: radixlm's hybrids) is one block whose own hash
    and parent are blocks of its KV medium (GPU / CPU_PINNED)."""

    def __init__(self):
        self.blocks: dict[str, dict[int, tuple[int | None, int]]] = {}  # medium -> hash -> ...
        self.log: list = []

    def apply(self, batch: KVEventBatch) -> None:
        for e in batch.events:
            self.log.append(e)
            if isinstance(e, AllBlocksCleared):
                self.blocks.clear()
            elif isinstance(e, BlockStored):
                live = self.blocks.setdefault(e.medium, {})
                assert e.block_size == 1 and len(e.token_ids) == len(e.block_hashes), e
                parent = e.parent_block_hash
                kv = self.kv_of(e.medium)
                assert parent is None or parent in kv, f"{e}: parent not stored"
                if e.medium.endswith("_STATE"):
                    assert len(e.block_hashes) == 1 and e.block_hashes[0] in kv, e
                for h, t in zip(e.block_hashes, e.token_ids, strict=True):
                    assert h not in live, f"block {h} stored twice in {e.medium}"
                    live[h] = (parent, t)
                    parent = h
            else:
                live = self.blocks.get(e.medium, {})
                for h in e.block_hashes:
                    assert h in live, f"block {h} removed from {e.medium} but not stored there"
                    del live[h]

    def live(self, medium: str = "GPU") -> dict[int, tuple[int | None, int]]:
        return self.blocks.get(medium, {})

    def kv_of(self, medium: str) -> dict:
        """The KV blocks a block of medium stands on: a device snapshot's are on the device (it
        lives only on a node in L1); a host snapshot's node may have its KV in either tier."""
        if medium == "GPU_STATE":
            return self.live("GPU")
        if medium == "CPU_PINNED_STATE":
            return {**self.live("GPU"), **self.live("CPU_PINNED")}
        return self.live(medium)


class Subscriber:
    def __init__(self, endpoint: str, topic: str):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.connect(endpoint)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.topic = topic.encode()
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.mirror = Mirror()
        self.seq = -1

    def drain(self, timeout: float = 2.0) -> list:
        """Apply every batch that arrives until the socket stays quiet; the events received."""
        start, deadline = len(self.mirror.log), time.monotonic() + timeout
        while self.sock.poll(150 if len(self.mirror.log) > start else int(timeout * 1000)):
            topic, seq, payload = self.sock.recv_multipart()
            assert topic == self.topic
            n = int.from_bytes(seq, "big")
            assert n == self.seq + 1, f"seq {n} after {self.seq}"
            self.seq = n
            batch = self.decoder.decode(payload)
            assert batch.attn_dp_rank in (None, 0) and batch.ts > 0
            self.mirror.apply(batch)
            if time.monotonic() > deadline:
                break
        return self.mirror.log[start:]


def tree_blocks(tree, in_medium=lambda n: n.value is not None) -> dict[int, tuple[int | None, int]]:
    """What the tree holds (nodes where in_medium), as SGLang's hashes: hash -> (parent, token)."""
    out = {}
    stack = [(c, None) for c in tree.root_node.children.values()]
    while stack:
        node, prior = stack.pop()
        parent = None if prior is None else hash_str_to_int64(prior)
        for t in node.key:
            prior = get_hash_str([t], prior)
            h = hash_str_to_int64(prior)
            if in_medium(node):
                out[h] = (parent, t)
            parent = h
        stack.extend((c, prior) for c in node.children.values())
    return out


def chain(ids: list[int]) -> list[int]:
    out, prior = [], None
    for t in ids:
        prior = get_hash_str([t], prior)
        out.append(hash_str_to_int64(prior))
    return out


# --- the scheduler with a publisher ---------------------------------------------------------
@pytest.fixture(scope="module")
def published(tiny_model_dir, tmp_path_factory):
    endpoint = f"ipc://{tmp_path_factory.mktemp('kv') / 'events'}"
    config = f'{{"publisher": "zmq", "endpoint": "{endpoint}", "topic": "kv@test"}}'
    d = Driver(make_scheduler(tiny_model_dir, kv_events_config=config, max_total_tokens=400))
    sub = Subscriber(endpoint, "kv@test")
    time.sleep(0.3)  # PUB/SUB: a subscriber joins late (ZMQ's slow joiner); nothing sent yet
    yield d, sub
    d.s.kv_events.shutdown()
    sub.sock.close(linger=0)


def run(d: Driver, ids: list[int], n: int = 4) -> None:
    d.submit(ids, max_new_tokens=n, temperature=0, ignore_eos=True)
    d.run()


def test_subscriber_sees_exactly_the_trees_blocks(published):
    d, sub = published
    g = torch.Generator().manual_seed(0)
    doc = torch.randint(100, 4000, (120,), generator=g).tolist()
    a = doc + torch.randint(100, 4000, (10,), generator=g).tolist()
    b = doc + torch.randint(100, 4000, (10,), generator=g).tolist()

    # Prompt A: stored blocks only, the whole prompt's chain among them.
    run(d, a)
    events = sub.drain()
    assert events and all(isinstance(e, BlockStored) and e.medium == "GPU" for e in events)
    assert set(chain(a)) <= set(sub.mirror.live())
    assert sub.mirror.live() == tree_blocks(d.s.tree_cache)

    # Prompt B shares doc: its own blocks are stored below doc's last block, doc's never again.
    run(d, b)
    events = sub.drain()
    assert all(isinstance(e, BlockStored) for e in events), events
    new = {h for e in events for h in e.block_hashes}
    assert not new & set(chain(doc)), "a shared block was stored again"
    assert set(chain(b)[len(doc) :]) <= new
    assert chain(doc)[-1] in {e.parent_block_hash for e in events}
    assert sub.mirror.live() == tree_blocks(d.s.tree_cache)

    # A flush: exactly one AllBlocksCleared, and the view is empty as the tree is.
    assert d.s.flush_cache().success
    d.step()  # the event loop's step after the control message: it publishes the step's events
    assert [type(e) for e in sub.drain()] == [AllBlocksCleared]
    assert sub.mirror.live() == {} == tree_blocks(d.s.tree_cache)

    # Eviction through the small pool (400 tokens): 5 prompts of 130 evict the older ones.
    for _ in range(5):
        run(d, torch.randint(100, 4000, (130,), generator=g).tolist())
    events = sub.drain()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert removed and all(e.medium == "GPU" for e in removed)
    assert sub.mirror.live() == tree_blocks(d.s.tree_cache)
    # The router's count of live blocks is the tree's own accounting (idle: all evictable).
    assert len(sub.mirror.live()) == d.s.tree_cache.evictable_size() > 0
    assert_idle_memory_ok(d.s)


def test_replay_serves_buffered_batches(tiny_model_dir, tmp_path):
    """The replay socket answers a start seq (8 bytes big-endian) with the buffered batches from
    it, [seq, payload] each, then [-1, b""]: a DEALER client (several replies to one request)."""
    pub, rep = f"ipc://{tmp_path / 'pub'}", f"ipc://{tmp_path / 'replay'}"
    config = f'{{"publisher": "zmq", "endpoint": "{pub}", "replay_endpoint": "{rep}"}}'
    d = Driver(make_scheduler(tiny_model_dir, kv_events_config=config))
    client = zmq.Context.instance().socket(zmq.DEALER)
    try:
        run(d, list(range(200, 240)), n=2)
        run(d, list(range(200, 230)) + [7, 8, 9], n=2)
        time.sleep(0.3)  # the publisher thread has encoded and buffered them
        client.connect(rep)
        client.send_multipart((b"", (1).to_bytes(8, "big")))  # from the second batch on
        got, decoder = [], msgspec.msgpack.Decoder(type=KVEventBatch)
        while True:
            assert client.poll(3000), "no replay answer"
            empty, seq, payload = client.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                assert payload == b""
                break
            got.append((n, decoder.decode(payload)))
        seqs = [n for n, _ in got]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 1, seqs
        stored = [e for _, b in got for e in b.events if isinstance(e, BlockStored)]
        # The second prompt's own blocks, below the shared prefix's last block.
        own = [e for e in stored if e.token_ids[:3] == [7, 8, 9]]
        assert len(own) == 1 and own[0].parent_block_hash == chain(list(range(200, 230)))[-1]
    finally:
        client.close(linger=0)
        d.s.kv_events.shutdown()


@pytest.mark.parametrize(
    "value, field",
    [
        ("{not json", "not JSON"),
        ('["zmq"]', "JSON object"),
        ('{"publisher": "kafka"}', "--kv-events-config.publisher"),
        ('{"publisher": "zmq", "endpoint": 5557}', "--kv-events-config.endpoint"),
        ('{"publisher": "zmq", "endpoint": "tcp://*"}', "--kv-events-config.endpoint"),
        ('{"publisher": "zmq", "hwm": -1}', "--kv-events-config.hwm"),
        ('{"publisher": "zmq", "topics": "x"}', "unknown field 'topics'"),
    ],
)
def test_malformed_config_is_one_line_naming_the_field(value, field):
    with pytest.raises(ValueError) as e:
        check_server_args(ServerArgs(kv_events_config=value))
    assert field in str(e.value) and "\n" not in str(e.value), str(e.value)


# --- the hierarchical cache: L1 and L2 as media ------------------------------------------------
def test_host_tier_moves_are_per_medium_events():
    """Insert, evict to L2 (write_through backed it up), load back on a match, evict L2: each
    medium's view equals the tree's L1 (GPU) and L2 (CPU_PINNED) contents after every move."""
    pool = TokenToKVPool(48, 1, 1, 4, torch.float32, "cpu")
    tree = HiRadixCache(pool, HostKVPool(64, pool, torch.float32), stats=HiCacheStats())
    rec = KVEventRecorder()
    tree.set_kv_events(rec)
    mirror, enc = Mirror(), msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(type=KVEventBatch)

    def sync():
        from radixlm import kv_event_schema

        batch = kv_event_schema.KVEventBatch(ts=time.time(), events=rec.take())
        mirror.apply(dec.decode(enc.encode(batch)))
        assert mirror.live("GPU") == tree_blocks(tree)
        assert mirror.live("CPU_PINNED") == tree_blocks(tree, lambda n: n.host.value is not None)

    a, b = list(range(10, 30)), list(range(10, 20)) + list(range(50, 60))
    for ids in (a, b):
        slots = pool.alloc(len(ids))
        pool.free(slots[: tree.insert(PrefixKey(ids), slots)])  # the shared part is the tree's
        sync()
    assert len(mirror.live("CPU_PINNED")) == 30  # write_through: backed up at insert
    tree.evict(30)  # all of L1 to L2
    sync()
    assert mirror.live("GPU") == {} and len(mirror.live("CPU_PINNED")) == 30
    match = tree.match_prefix(PrefixKey(a))  # loaded back from L2
    assert len(match.indices) == 20
    sync()
    assert set(chain(a)) == set(mirror.live("GPU"))
    tree.evict_host(64)  # L2-only nodes leave the tree; L1 nodes keep their L1 copy
    sync()
    assert set(mirror.live("GPU")) == set(chain(a)) and mirror.live("CPU_PINNED") == {}
    tree.flush("l2")
    sync()
    assert mirror.blocks == {}
