"""The lazy free list hands out exactly the slots, in exactly the order, of the eager
concatenation it replaced (torch.cat of the whole list on every free)."""

import random

import torch

from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.slot_free_list import SlotFreeList


def test_same_allocations_as_eager_concatenation():
    rng = random.Random(0)
    lazy = SlotFreeList(torch.arange(1, 201))
    eager = torch.arange(1, 201)
    held: list[torch.Tensor] = []
    for _ in range(2000):
        if held and rng.random() < 0.5:
            run = held.pop(rng.randrange(len(held)))
            lazy.free(run)
            eager = torch.cat((eager, run))
        else:
            need = rng.randint(1, 40)
            got = lazy.alloc(need)
            if need > eager.numel():
                assert got is None
                continue
            want, eager = eager[:need], eager[need:]
            assert torch.equal(got, want)
            held.append(got)
        assert len(lazy) == eager.numel()
    assert torch.equal(lazy.slots, eager)


def test_a_freed_view_is_copied():
    """Callers free views of request rows that are then reused: the list keeps the values."""
    lazy = SlotFreeList(torch.arange(1, 5))
    row = torch.tensor([7, 8, 9])
    lazy.free(row[:2])
    row[:] = 0
    assert lazy.slots.tolist() == [1, 2, 3, 4, 7, 8]


def test_pool_reads_and_sets_the_whole_list():
    pool = TokenToKVPool(size=8, num_layers=1, num_kv_heads=1, head_dim=8)
    a = pool.alloc(5)
    pool.free(a[1:3])
    assert pool.available_size() == 5
    assert pool.free_slots.tolist() == [6, 7, 8, 2, 3]
    pool.free_slots = pool.free_slots.flip(0)  # tests shuffle it (tests/model/helpers.py)
    assert pool.alloc(2).tolist() == [3, 2]
