"""SWATokenToKVPool's two slot spaces and SWARadixCache's rule for a usable match, directly: the
end-to-end checks against HF are tests/model/test_swa_cache.py."""

from __future__ import annotations

import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.swa_pool import SWATokenToKVPool
from radixlm.cache.swa_radix_cache import SWARadixCache

W = 4


def _pool(size: int = 32, swa: int = 16) -> SWATokenToKVPool:
    # layers 0 and 2 windowed, 1 and 3 full
    return SWATokenToKVPool(size, swa, 4, [0, 2], 2, 8, window=W)


def test_each_slot_space_holds_its_layers():
    pool = _pool()
    assert pool.full.k_buffer[1].shape == (33, 2, 8) and pool.full.k_buffer[0].shape[1] == 0
    assert pool.swa.k_buffer[0].shape == (17, 2, 8) and pool.swa.k_buffer[1].shape[1] == 0
    slots = pool.alloc(3)
    k = torch.randn(3, 2, 8)
    pool.set_kv_buffer(0, slots, k, k + 1)
    swa = pool.translate(slots)
    assert (swa > 0).all() and torch.equal(pool.get_kv_buffer(0)[0][swa], k)
    pool.set_kv_buffer(1, slots, k, k)
    assert torch.equal(pool.get_kv_buffer(1)[0][slots], k)
    assert pool.check() is None


def test_alloc_needs_both_spaces_and_free_gives_back_both():
    pool = _pool(size=32, swa=4)
    assert pool.alloc(5) is None  # the windowed space is short
    a = pool.alloc(4)
    assert pool.swa_available_size() == 0 and pool.available_size() == 28
    assert pool.free_swa(a[:2]) == 2 and pool.free_swa(a[:2]) == 0
    assert pool.has_swa(a).tolist() == [False, False, True, True]
    b = pool.alloc(2)  # the windowed slots a[:2] gave back
    pool.free(a)
    pool.free(b)
    assert pool.available_size() == 32 and pool.swa_available_size() == 4
    assert pool.check() is None


def test_move_swa_hands_a_duplicate_windowed_slot_to_the_tree_copy():
    pool = _pool()
    tree, mine = pool.alloc(3), pool.alloc(3)
    pool.free_swa(tree[:2])
    keep = pool.translate(mine[:2]).clone()
    pool.move_swa(tree, mine)
    assert torch.equal(pool.translate(tree[:2]), keep)
    assert not pool.has_swa(mine[:2]).any() and pool.has_swa(mine[2:]).all()
    pool.free(mine)
    assert pool.check() is None


def test_check_finds_a_windowed_slot_with_two_owners():
    pool = _pool()
    a = pool.alloc(2)
    pool.full_to_swa[a[1]] = pool.full_to_swa[a[0]]
    assert "exactly one owner" in pool.check()


def test_a_match_ends_where_its_window_is_whole():
    pool = _pool(size=64, swa=64)
    tree = SWARadixCache(pool, W)
    ids = list(range(100, 130))
    slots = pool.alloc(30)
    tree.insert(PrefixKey(ids), slots)
    assert len(tree.match_prefix(PrefixKey(ids)).indices) == 30
    pool.free_swa(slots[20:22])  # a hole: the window of 22..24 misses it
    assert tree.usable_len(slots) == 30  # the last W slots are whole
    assert tree.usable_len(slots[:24]) == 20
    assert len(tree.match_prefix(PrefixKey(ids[:25])).indices) == 20
    pool.free_swa(slots[27:28])  # and the tail misses one: back to the first whole window
    assert len(tree.match_prefix(PrefixKey(ids)).indices) == 27
    pool.free_swa(slots[:20:3])  # holes every 3 before 20: no whole window left there
    assert tree.usable_len(slots[:20]) == 0
    assert tree.usable_len(slots[:3]) == 0


def test_evict_swa_spares_pinned_slots_and_keeps_full_kv():
    pool = _pool(size=64, swa=64)
    tree = SWARadixCache(pool, W)
    slots = pool.alloc(20)
    tree.insert(PrefixKey(list(range(20))), slots)
    pool.pin(slots[-W:])
    assert tree.swa_evictable_size() == 20 - W
    assert tree.evict_swa(100) == 20 - W
    assert pool.has_swa(slots).tolist() == [False] * (20 - W) + [True] * W
    assert tree.total_size() == 20  # the full layers' KV stays
    pool.unpin(slots[-W:])
    assert pool.check() is None


def test_bytes_per_token_is_the_pool_interface():
    """Callers price a token in every layer through any pool (one_batch's roofline, the decode
    mirror); the split figure is the sizing's."""
    from radixlm.cache.memory_pool import TokenToKVPool

    pool = _pool()
    args = (pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype, pool.v_head_dim)
    assert pool.bytes_per_token(*args) == TokenToKVPool.bytes_per_token(*args)
    per_layer = TokenToKVPool.bytes_per_token(1, 2, 8, torch.float32)
    assert (
        SWATokenToKVPool.split_bytes_per_token(2, 2, 0.25, 2, 8, torch.float32) == 2.5 * per_layer
    )
