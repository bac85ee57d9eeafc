"""The radix caches are one tree composed with a tier policy and a snapshot part (tree_parts.py,
issue 89): each named cache is the tree with its parts, by single inheritance only, and a
combination whose parts do not fit is refused at construction."""

from __future__ import annotations

import pytest
import torch

from radixlm.cache.hi_mamba_radix_cache import HiMambaRadixCache, HostSnapshots
from radixlm.cache.hiradix_cache import HiRadixCache
from radixlm.cache.host_pool import HostKVPool
from radixlm.cache.host_state_pool import HostStatePool
from radixlm.cache.host_tier import HostTier
from radixlm.cache.mamba_radix_cache import DeviceSnapshots, MambaRadixCache
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.radix_cache import DeviceOnlyTier, NoSnapshots, RadixCache
from radixlm.cache.state_pool import MambaPool, StateSpec
from radixlm.cache.swa_radix_cache import SWARadixCache
from radixlm.cache.tree_parts import CacheTier, SnapshotPart

SPECS = [[StateSpec("conv", (2, 3), torch.float32)]]


def pools():
    kv = TokenToKVPool(32, num_layers=1, num_kv_heads=1, head_dim=1)
    return kv, MambaPool(SPECS, rows=2, snapshots=2), HostKVPool(64, kv, torch.float32)


def test_each_named_cache_is_the_tree_with_its_parts():
    kv, states, host = pools()
    built = {
        RadixCache: RadixCache(kv),
        HiRadixCache: HiRadixCache(kv, host),
        MambaRadixCache: MambaRadixCache(kv, states),
        HiMambaRadixCache: HiMambaRadixCache(kv, states, host, HostStatePool(SPECS, 2)),
    }
    expected = {
        RadixCache: (DeviceOnlyTier, NoSnapshots),
        HiRadixCache: (HostTier, NoSnapshots),
        MambaRadixCache: (DeviceOnlyTier, DeviceSnapshots),
        HiMambaRadixCache: (HostTier, HostSnapshots),
    }
    for cls, tree in built.items():
        assert (type(tree.tier), type(tree.snapshots)) == expected[cls], cls.__name__
        assert tree.tier.tree is tree and tree.snapshots.tree is tree
        assert {p.PAYLOAD for p in (tree.tier, tree.snapshots)} - {None} == set(cls.PARTS)


def test_no_cache_inherits_from_two_classes():
    for cls in (RadixCache, HiRadixCache, MambaRadixCache, HiMambaRadixCache, SWARadixCache):
        assert len(cls.__bases__) == 1, cls.__mro__
    # the no-op parts and the real ones are siblings under their interface
    for null, real in ((DeviceOnlyTier, HostTier), (NoSnapshots, DeviceSnapshots)):
        assert not issubclass(real, null) and not issubclass(null, real)
    assert issubclass(DeviceOnlyTier, CacheTier) and issubclass(HostTier, CacheTier)
    assert issubclass(NoSnapshots, SnapshotPart) and issubclass(DeviceSnapshots, SnapshotPart)


def test_parts_that_do_not_fit_are_refused():
    kv, states, host = pools()
    # A snapshot part on a tree whose nodes carry no snapshot payload.
    with pytest.raises(AssertionError):
        RadixCache(kv, snapshots=DeviceSnapshots(states))
    # Host snapshots follow their nodes into L2: not without a host tier.
    tree = object.__new__(MambaRadixCache)  # its PARTS carry the snapshot payload
    with pytest.raises(AssertionError, match="host snapshots"):
        RadixCache.__init__(tree, kv, snapshots=HostSnapshots(states, HostStatePool(SPECS, 2)))
