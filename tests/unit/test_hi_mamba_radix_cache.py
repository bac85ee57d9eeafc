"""HiMambaRadixCache (a hybrid model's hierarchical cache): device snapshots that leave go to the
host tier and come back on a match with the same tensors; a damaged host copy is a miss for its
part of the prefix (counted), never a wrong state; a full host drops its least recently used
unlocked snapshots; and after a random mixed workload every snapshot a match hands out holds the
states of its own prefix, with no KV or snapshot slot leaked (the tree's invariant check).

State copies run where the forward would run them: `forward(states)` applies the queue."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.factory import create_prefix_cache, prefix_cache_kind
from radixlm.cache.hi_mamba_radix_cache import HiMambaRadixCache
from radixlm.cache.hicache_config import HiCacheConfig
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.host_state_pool import HostStatePool
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.state_pool import MambaPool, StateSpec

SPECS = [
    [StateSpec("conv", (2, 3), torch.float32), StateSpec("ssm", (2, 2, 2), torch.float32)],
    [StateSpec("conv", (2, 3), torch.bfloat16), StateSpec("ssm", (2, 2, 2), torch.float32)],
]
ROWS = 2


def make(
    snapshots: int = 2,
    host_states: int = 8,
    kv: int = 64,
    l2: int = 256,
    policy: str = "write_through",
):
    kv_pool = TokenToKVPool(kv, num_layers=1, num_kv_heads=1, head_dim=1)
    states = MambaPool(SPECS, rows=ROWS, snapshots=snapshots)
    host = HostKVPool(l2, kv_pool, torch.float32)
    tree = HiMambaRadixCache(kv_pool, states, host, HostStatePool(SPECS, host_states), policy)
    return tree, kv_pool, states


def K(ids) -> PrefixKey:
    return PrefixKey(list(ids))


def forward(states: MambaPool) -> None:
    """What the next forward does first: the queued copies, in order."""
    states.apply_copies(states.take_copies())


def fill(states: MambaPool, slot: int, value: float) -> None:
    for layer in states.buffers:
        for buf in layer.values():
            buf[slot] = value


def read(states: MambaPool, slot: int) -> list[torch.Tensor]:
    return [buf[slot].clone() for layer in states.buffers for buf in layer.values()]


def insert(tree, kv_pool, ids) -> None:
    ids = list(ids)
    short = len(ids) - kv_pool.available_size()
    if short > 0:
        tree.evict(short)
    value = kv_pool.alloc(len(ids))
    shared = tree.insert(K(ids), value)
    kv_pool.free(value[:shared])


def snapshot(tree, states, ids, value: float) -> int | None:
    """A snapshot after ids, written as a request's release writes one: a copy queued from its
    row (the row's state set by an earlier forward)."""
    forward(states)
    fill(states, 0, value)
    slot = tree.attach_state(K(ids), tree.alloc_state)
    if slot is not None:
        states.queue_copy(0, slot)
    return slot


def test_snapshots_go_to_the_host_and_come_back_with_the_same_tensors():
    tree, kv_pool, states = make(snapshots=2)
    a = list(range(1, 7))
    insert(tree, kv_pool, a)
    slot = snapshot(tree, states, a, 0.0)
    forward(states)
    for layer in states.buffers:  # distinct values everywhere, both dtypes
        for buf in layer.values():
            buf[slot] = torch.randn(buf[slot].shape).to(buf.dtype)
    want = read(states, slot)
    node = tree.match_prefix(K([*a, 99])).last_node
    for first in (10, 20):  # two more snapshots: a's, the least recently used, goes down
        insert(tree, kv_pool, [first, first + 1])
        snapshot(tree, states, [first, first + 1], float(first))
    assert node.snapshot.slot is None and node.snapshot.host_slot is not None
    forward(states)  # the backup ran before the slot's reuse was written
    assert tree.stats.state_l1_to_l2 == 1
    assert len(tree.peek_prefix(K([*a, 99])).indices) == 0  # not on the device any more

    m = tree.match_prefix(K([*a, 99]))
    assert len(m.indices) == 6 and m.last_node is node and node.snapshot.slot is not None
    forward(states)
    for got, exp in zip(read(states, node.snapshot.slot), want):
        assert torch.equal(got, exp)
    assert tree.stats.state_l2_loads == 1 and tree.stats.state_corrupt == 0
    assert node.snapshot.host_slot is not None  # the host copy stays (no second backup needed)
    assert tree.check() is None


def test_a_node_evicted_to_l2_brings_its_kv_and_snapshot_back():
    tree, kv_pool, states = make(snapshots=2, kv=16)
    a = list(range(1, 11))
    value = kv_pool.alloc(10)
    kv_pool.k_buffer[0][value] = torch.arange(10.0).view(10, 1, 1)  # computed before insert
    tree.insert(K(a), value)
    snapshot(tree, states, a, 7.0)
    insert(tree, kv_pool, range(30, 42))  # 12 more tokens in a pool of 16: a goes to L2
    node = tree.locate(K(a))[0]
    assert node.value is None and node.host.value is not None
    assert node.snapshot.slot is None and node.snapshot.host_slot is not None
    forward(states)
    m = tree.match_prefix(K([*a, 99]))
    assert len(m.indices) == 10 and m.last_node is node
    assert torch.equal(kv_pool.k_buffer[0][m.indices].flatten(), torch.arange(10.0))
    forward(states)
    assert all(torch.all(t == 7.0) for t in read(states, node.snapshot.slot))
    assert tree.stats.l2_hit_tokens == 10 and tree.stats.state_l2_loads == 1
    assert tree.check() is None


def test_a_corrupt_host_snapshot_is_a_miss_for_its_part_of_the_prefix():
    tree, kv_pool, states = make(snapshots=2)
    a = list(range(1, 9))
    insert(tree, kv_pool, a)
    snapshot(tree, states, a[:3], 3.0)
    snapshot(tree, states, a, 8.0)
    for first in (10, 20):  # both of a's snapshots go to the host
        insert(tree, kv_pool, [first, first + 1])
        snapshot(tree, states, [first, first + 1], float(first))
    forward(states)
    deep = tree.locate(K(a))[0]
    assert deep.snapshot.slot is None and deep.snapshot.host_slot is not None
    tree.host_states.buffers[1]["ssm"][deep.snapshot.host_slot, 0, 1, 0] += 1.0  # one damaged value

    m = tree.match_prefix(K([*a, 99]))
    assert len(m.indices) == 3  # the shallower snapshot, from the host as well
    forward(states)
    assert all(torch.all(t == 3.0) for t in read(states, m.last_node.snapshot.slot))
    assert tree.stats.state_corrupt == 1 and tree.stats.state_l2_loads == 1
    assert deep.snapshot.host_slot is None  # dropped, its slot free again (the check counts it)
    assert tree.check() is None


def test_a_snapshot_not_yet_backed_up_is_not_read():
    """A backup still queued (no forward since) leaves the host copy unreadable: the match falls
    back, and the slot, freed meanwhile, is reused only after the backup ran."""
    tree, kv_pool, states = make(snapshots=1, host_states=1)
    insert(tree, kv_pool, [1, 2])
    snapshot(tree, states, [1, 2], 1.0)
    insert(tree, kv_pool, [5, 6])
    snapshot(tree, states, [5, 6], 5.0)  # [1, 2]'s snapshot: backup queued
    node = tree.locate(K([1, 2]))[0]
    assert (
        node.snapshot.host_slot is not None
        and tree.host_states.verify(node.snapshot.host_slot) is None
    )
    assert len(tree.match_prefix(K([1, 2, 3])).indices) == 0
    tree._evict_host_states(1)  # freed with its backup queued: held back
    assert tree.host_states.available() == 0 and tree.check() is None
    forward(states)
    assert tree.host_states.available() == 1 and tree.check() is None


def test_a_full_host_drops_its_least_recently_used_unlocked_snapshots():
    tree, kv_pool, states = make(snapshots=1, host_states=2)
    seqs = [[s, s + 1] for s in (10, 20, 30, 40, 50)]
    for s in seqs[:3]:  # 10 and 20 go to the host, 30 stays on the device
        insert(tree, kv_pool, s)
        snapshot(tree, states, s, float(s[0]))
    forward(states)
    node_of = lambda s: tree.locate(K(s))[0]
    locked = node_of(seqs[0])
    tree.inc_lock_ref(locked)  # the oldest, but a request holds it
    insert(tree, kv_pool, seqs[3])
    snapshot(tree, states, seqs[3], 40.0)  # 30 goes down: 20's host copy makes room
    forward(states)
    assert tree.stats.state_l2_evicted == 1
    assert node_of(seqs[1]).snapshot.host_slot is None
    assert locked.snapshot.host_slot is not None
    tree.dec_lock_ref(locked)
    insert(tree, kv_pool, seqs[4])
    snapshot(tree, states, seqs[4], 50.0)  # 40 goes down: now 10's host copy goes
    assert locked.snapshot.host_slot is None and tree.stats.state_l2_evicted == 2
    where = [
        (n.snapshot.slot is not None, n.snapshot.host_slot is not None) for n in map(node_of, seqs)
    ]
    assert where == [(False, False), (False, False), (False, True), (False, True), (True, False)]
    forward(states)
    for s, n in ((seqs[0], 0), (seqs[3], 2)):
        m = tree.match_prefix(K([*s, 0]))
        assert len(m.indices) == n, s
    forward(states)
    assert all(torch.all(t == 40.0) for t in read(states, m.last_node.snapshot.slot))
    assert tree.check() is None


def _owners_ok(tree, states, held: list[int]) -> None:
    """Every device snapshot slot free, on one node or held (the state tracker's check)."""
    owned = sorted([*states.free_snapshots, *tree.state_slots(), *held])
    assert owned == list(range(ROWS, ROWS + states.snapshots))
    assert tree.check() is None


@pytest.mark.parametrize(
    "seed, policy",
    [(0, "write_through"), (1, "write_through"), (2, "write_back"), (3, "write_through_selective")],
)
def test_a_mixed_workload_hands_out_only_right_states_and_leaks_nothing(seed, policy):
    """Random inserts, snapshots, matches (some held locked a while), KV eviction, host damage and
    forwards at random moments. Snapshot values are a function of their prefix: whatever a match
    hands out must be its prefix's, whichever tiers it went through."""
    rng = random.Random(seed)
    tree, kv_pool, states = make(snapshots=3, host_states=5, kv=40, l2=60, policy=policy)

    def value(prefix) -> float:
        return float(hash(tuple(prefix)) % 997)

    locks: list = []
    for _ in range(400):
        seq = [rng.randint(1, 3) for _ in range(rng.randint(1, 12))]
        op = rng.random()
        if op < 0.3:
            insert(tree, kv_pool, seq)
            cut = rng.randint(1, len(seq))
            snapshot(tree, states, seq[:cut], value(seq[:cut]))
        elif op < 0.6:
            m = tree.match_prefix(K(seq))
            n = len(m.indices)
            assert (m.last_node.snapshot.slot is not None) == (n > 0)
            forward(states)
            if n:
                want = value(seq[:n])
                got = read(states, m.last_node.snapshot.slot)
                assert all(torch.all(t == torch.tensor(want).to(t.dtype)) for t in got), seq
                if rng.random() < 0.5:
                    tree.inc_lock_ref(m.last_node)
                    locks.append(m.last_node)
        elif op < 0.7 and locks:
            tree.dec_lock_ref(locks.pop(rng.randrange(len(locks))))
        elif op < 0.8:
            tree.evict(rng.randint(1, 10))
        elif op < 0.85:
            forward(states)
            used = [n for n in tree.all_nodes() if n.snapshot.host_slot is not None]
            if used:  # damage one host copy: the next match through it must not use it
                n = rng.choice(used)
                tree.host_states.buffers[0]["conv"][n.snapshot.host_slot] += 1.0
        else:
            forward(states)
        _owners_ok(tree, states, [])
    for n in locks:
        tree.dec_lock_ref(n)
    forward(states)
    _owners_ok(tree, states, [])
    assert tree.stats.state_l1_to_l2 > 0 and tree.stats.state_l2_loads > 0
    assert tree.stats.state_corrupt > 0  # damaged copies were met, and none was handed out
    tree.flush("l1")  # everything down; the queued copies run in flush
    assert tree.total_size() == 0 and states.available_snapshots() == states.snapshots
    _owners_ok(tree, states, [])
    tree.flush("l2")
    assert tree.host_states.available() == tree.host_states.size and tree.check() is None


def test_flush_l1_keeps_snapshots_on_the_host():
    tree, kv_pool, states = make()
    insert(tree, kv_pool, [1, 2, 3])
    snapshot(tree, states, [1, 2, 3], 4.0)  # its copy still queued: flush runs it first
    tree.flush("l1")
    kv_pool.clear()  # as CacheManager.flush does
    states.clear()
    m = tree.match_prefix(K([1, 2, 3, 4]))
    assert len(m.indices) == 3
    forward(states)
    assert all(torch.all(t == 4.0) for t in read(states, m.last_node.snapshot.slot))


def test_the_factory_chooses_it_and_splits_the_host_budget():
    kv_pool = TokenToKVPool(100, num_layers=1, num_kv_heads=1, head_dim=4)
    states = MambaPool(SPECS, rows=ROWS, snapshots=4)
    assert prefix_cache_kind(False, HiCacheConfig(), hybrid=True) == "hierarchical-mamba"
    tree = create_prefix_cache(kv_pool, False, HiCacheConfig(ratio=3.0), lambda d: "m", states)
    assert isinstance(tree, HiMambaRadixCache)
    assert tree.host_states.size == 12 and tree.host_pool.size == 300
    # --hicache-size: the device's proportion of state bytes to KV bytes
    share = states.total_bytes / (states.total_bytes + kv_pool.total_bytes)
    tree = create_prefix_cache(kv_pool, False, HiCacheConfig(size_gb=2**-16), lambda d: "m", states)
    assert tree.host_states.size == int(2**14 * share) // states.state_bytes
    assert tree.host_pool.size == int(2**14 * (1 - share)) // tree.host_pool.bytes_per_token
    with pytest.raises(ValueError) as refused:
        prefix_cache_kind(False, HiCacheConfig(storage_backend="file"), hybrid=True)
    assert str(refused.value) == (
        "--hicache-storage-backend: a hybrid model's state snapshots have no storage tier;"
        " use the host tier alone"
    )
