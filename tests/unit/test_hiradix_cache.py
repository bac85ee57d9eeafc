"""HiRadixCache: a stateful property test against a naive model. Requests match (loading L2 back),
compute the rest and insert; L1 and L2 evict under pressure; L3 prefetches hang chunks back in.
After every step: the tier invariants hold, every L1 slot has one owner, and any KV a match hands
out is exactly the KV computed for those tokens (whichever tiers it travelled through)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.hicache_config import WRITE_POLICIES
from radixlm.cache.hicache_io import HiCacheStats
from radixlm.cache.hiradix_cache import HiRadixCache
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.storage import HiCacheFile
from radixlm.cache.storage_codec import ChunkLayout
from radixlm.cache.storage_tier import StorageTier

L1 = 48
CHUNK = 4
# Sequences share prefixes: a small alphabet, and the machine extends earlier sequences.
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=24)
# Two namespaces (e.g. two LoRA adapters): the same tokens under each have different KV.
NAMESPACES = st.sampled_from([None, "adapter-a"])


def kv_of(prefix: list[int], ns=None) -> float:
    """The KV 'computed' for the last token of prefix: a function of the whole prefix (and
    namespace)."""
    return int(hashlib.sha256(str((ns, prefix)).encode()).hexdigest()[:6], 16) / 2**20


def expected(seq: list[int], n: int, ns=None) -> torch.Tensor:
    return torch.tensor([kv_of(seq[: i + 1], ns) for i in range(n)])


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class HiCacheMachine(RuleBasedStateMachine):
    def __init__(self, policy: str, l2: int, storage_dir=None):
        super().__init__()
        self.pool = TokenToKVPool(L1, num_layers=2, num_kv_heads=1, head_dim=2)
        host = HostKVPool(l2, self.pool, torch.float32)
        stats = HiCacheStats()
        layout = ChunkLayout(2, 1, 2, torch.float32, CHUNK)
        storage = (
            StorageTier(HiCacheFile(storage_dir, "m", layout), "m", CHUNK, stats)
            if storage_dir
            else None
        )
        self.has_storage = storage is not None
        self.tree = HiRadixCache(self.pool, host, policy, storage, stats)
        self.inserted: list[tuple] = []  # (namespace, sequence)
        self.lossless = policy != "write_through_selective" and l2 >= 10_000

    def teardown(self):
        self.tree.close()

    def _check_kv(self, seq: list[int], indices: torch.Tensor, ns=None) -> None:
        exp = expected(seq, len(indices), ns)
        for layer in range(2):
            k, v = self.pool.get_kv_buffer(layer)
            assert torch.equal(k[indices][:, 0, 0], exp), "L1 holds other KV than was computed"
            assert torch.equal(v[indices][:, 0, 1], exp + layer)

    @initialize()
    def start(self):
        pass

    @rule(seq=TOKENS, extend=st.booleans(), ns=NAMESPACES)
    def request(self, seq, extend, ns):
        if extend and self.inserted:
            ns, last = self.inserted[-1]
            seq = last + seq
        seq = seq[:40]
        known = max((lcp(seq, s) for n, s in self.inserted if n == ns), default=0)
        indices, node = self.tree.match_prefix(PrefixKey(seq, ns))
        assert len(indices) <= known, "matched tokens never inserted"
        if self.lossless:
            assert len(indices) == known, f"lost KV: matched {len(indices)} of {known}"
        self._check_kv(seq, indices, ns)
        self.tree.inc_lock_ref(node)
        rest = len(seq) - len(indices)
        short = rest - self.pool.available_size()
        if short > 0:
            self.tree.evict(short)
        new = self.pool.alloc(rest)
        if new is None:
            self.tree.dec_lock_ref(node)
            return
        vals = expected(seq, len(seq), ns)[len(indices) :]
        for layer in range(2):
            kv = torch.stack([vals, vals + layer], -1)[:, None, :]
            self.pool.set_kv_buffer(layer, new, kv, kv)
        row = torch.cat([indices, new])
        shared = self.tree.insert(PrefixKey(seq, ns), row)
        self.pool.free(row[len(indices) : shared])
        self.tree.dec_lock_ref(node)
        self.inserted.append((ns, seq))

    @rule(n=st.integers(1, L1))
    def evict_l1(self, n):
        self.tree.evict(n)

    @rule(n=st.integers(1, 32))
    def evict_l2(self, n):
        self.tree.evict_host(n)
        self.lossless = False  # dropped on purpose from here on

    @rule(seq=TOKENS, ns=NAMESPACES)
    def prefetch_from_storage(self, seq, ns):
        if not self.has_storage:
            return
        if (
            self.inserted
        ):  # the namespace drawn: tokens stored under the other one must not come back
            seq = (self.inserted[-1][1] + seq)[:40]
        self.tree.storage_tier.wait_writes()
        p = self.tree.start_prefetch(PrefixKey(seq, ns))
        if p is not None:
            for f in p.futures:
                f.result()
            self.tree.poll_prefetches()
            assert p.done
        indices, _ = self.tree.match_prefix(PrefixKey(seq, ns))
        self._check_kv(seq, indices, ns)

    @invariant()
    def tiers_sound(self):
        assert self.tree.check() is None, self.tree.check()
        nodes = self.tree.all_nodes()
        owned = self.pool.free_slots.tolist() + [
            s for n in nodes if n.value is not None for s in n.value.tolist()
        ]
        assert sorted(owned) == list(range(1, L1 + 1)), "an L1 slot without exactly one owner"
        assert self.tree.evictable_size() == self.tree.total_size()  # nothing locked between rules
        assert all(n.lock_ref == 0 for n in nodes)


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("policy", WRITE_POLICIES)
@pytest.mark.parametrize("l2", [10_000, 24])
def test_tiers_against_naive_model(policy, l2):
    run_state_machine_as_test(lambda: HiCacheMachine(policy, l2), settings=SETTINGS)


@pytest.mark.parametrize("policy", WRITE_POLICIES)
def test_with_storage_against_naive_model(policy, tmp_path_factory):
    run_state_machine_as_test(
        lambda: HiCacheMachine(policy, 24, str(tmp_path_factory.mktemp("l3"))), settings=SETTINGS
    )


def test_eviction_moves_down_and_load_back_restores():
    pool = TokenToKVPool(L1, num_layers=1, num_kv_heads=1, head_dim=1)
    tree = HiRadixCache(pool, HostKVPool(100, pool, torch.float32), "write_back")
    seq = [1, 2, 3, 4, 5]
    slots = pool.alloc(5)
    pool.set_kv_buffer(
        0, slots, torch.arange(5.0)[:, None, None], -torch.arange(5.0)[:, None, None]
    )
    tree.insert(PrefixKey(seq), slots)
    assert tree.evict(5) == 5 and pool.available_size() == L1
    assert tree.peek_prefix(PrefixKey(seq))[0].numel() == 0  # not in L1 ...
    assert tree.match_len(PrefixKey(seq)) == 5  # ... but in L2
    indices, node = tree.match_prefix(PrefixKey(seq + [9]))
    assert len(indices) == 5 and tree.stats.l2_hit_tokens == 5
    k, v = pool.get_kv_buffer(0)
    assert k[indices].flatten().tolist() == [0, 1, 2, 3, 4] and v[indices].flatten().tolist() == [
        0,
        -1,
        -2,
        -3,
        -4,
    ]
