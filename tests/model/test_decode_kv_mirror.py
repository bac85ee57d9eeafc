"""The decode KV mirror gives exactly the attention of the gather path while decode batches change
under it: requests join and leave, request slots are reused, a request's KV grows outside decode
(an extend after a jump-forward), capacity grows, and batches too big for its budget fall back."""

import random

import pytest
import torch

from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention import RadixAttention, TorchSDPABackend

LAYERS, KVH, HEADS, D = 2, 2, 4, 8


def write_kv(kv_pool, slots, gen):
    for layer in range(LAYERS):
        k = torch.randn(len(slots), KVH, D, generator=gen)
        kv_pool.set_kv_buffer(layer, slots, k, torch.randn(len(slots), KVH, D, generator=gen))


def decode_step(tested, reference, req_pool, kv_pool, live, batch, gen):
    """One decode step of `batch` (request slots; `live` maps each to its KV slots, extended here)
    through both backends, every layer's attention compared."""
    out = kv_pool.alloc(len(batch))
    for idx, slot in zip(batch, out.tolist()):
        req_pool.req_to_token[idx, len(live[idx])] = slot
        live[idx].append(slot)
    seq_lens = [len(live[i]) for i in batch]
    fb = ForwardBatch(ForwardMode.DECODE, len(batch), torch.zeros(len(batch), dtype=torch.int64),
                      torch.tensor(seq_lens) - 1, torch.tensor(batch), torch.tensor(seq_lens), out,
                      req_pool, kv_pool, seq_lens_cpu=seq_lens)
    tested.init_forward_metadata(fb)
    reference.init_forward_metadata(fb)
    for i in range(LAYERS):
        layer = RadixAttention(HEADS, D, D**-0.5, KVH, i)
        q = torch.randn(len(batch), HEADS, D, generator=gen)
        k, v = torch.randn(len(batch), KVH, D, generator=gen), torch.randn(len(batch), KVH, D, generator=gen)
        kv_pool.set_kv_buffer(i, out, k, v)
        torch.testing.assert_close(tested.forward_decode(q, k, v, layer, fb),
                                   reference.forward_decode(q, k, v, layer, fb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mirror_matches_gather_path(seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    req_pool, kv_pool = ReqToTokenPool(12, 700), TokenToKVPool(6000, LAYERS, KVH, D)
    per_token = LAYERS * 2 * KVH * D * 4
    # Room for about 6 requests of 300 tokens: bigger batches take the gather path.
    mirrored = TorchSDPABackend(shared_prefix=False, mirror_bytes=6 * 300 * per_token)
    plain = TorchSDPABackend(shared_prefix=False)
    live: dict[int, list[int]] = {}  # req slot -> its KV slots
    used_mirror = fell_back = in_order = 0
    for step in range(120):
        freed_len = None
        if live and rng.random() < 0.25:  # a request finishes: its slots go back
            idx = rng.choice(list(live))
            freed_len = len(live[idx])
            kv_pool.free(torch.tensor(live.pop(idx)))
            req_pool.free(idx)
        while len(live) < 2 or (len(live) < 10 and rng.random() < 0.2):  # a request joins
            idx, n = req_pool.alloc(), rng.randrange(1, 260)
            if freed_len is not None:  # the freed request slot, at the length its last owner had
                n, freed_len = freed_len, None
            slots = kv_pool.alloc(n)
            write_kv(kv_pool, slots, gen)
            req_pool.req_to_token[idx, :n] = slots
            live[idx] = slots.tolist()
        if rng.random() < 0.1:  # a request's KV grows by an extend step (jump-forward)
            idx, n = rng.choice(list(live)), rng.randrange(1, 9)
            slots = kv_pool.alloc(n)
            write_kv(kv_pool, slots, gen)
            req_pool.req_to_token[idx, len(live[idx]) : len(live[idx]) + n] = slots
            live[idx] += slots.tolist()
        batch = rng.sample(list(live), len(live)) if rng.random() < 0.3 else list(live)  # any order
        decode_step(mirrored, plain, req_pool, kv_pool, live, batch, gen)
        used_mirror += mirrored._use_mirror
        fell_back += not mirrored._use_mirror
        in_order += mirrored._use_mirror and mirrored.mirror.row_of is None  # rows need no reordering
    assert used_mirror > 10 and fell_back > 0 and 0 < in_order < used_mirror  # every path ran


def test_kept_shared_prefix_kv_matches_and_goes_stale_when_slots_are_freed():
    """The shared-prefix path keeps each group's gathered prefix K/V across steps: same output as
    gathering anew, reused while the groups' prefixes stay, dropped once any KV slot is freed
    (the slots may then hold other tokens)."""
    gen = torch.Generator().manual_seed(0)
    req_pool, kv_pool = ReqToTokenPool(8, 400), TokenToKVPool(3000, LAYERS, KVH, D)
    keeping = TorchSDPABackend(shared_prefix=True, mirror_bytes=1 << 24)
    plain = TorchSDPABackend(shared_prefix=True)
    live = {}
    for g in range(2):  # two groups of three requests, each sharing a 100-token prefix
        prefix = kv_pool.alloc(100)
        write_kv(kv_pool, prefix, gen)
        for _ in range(3):
            idx, own = req_pool.alloc(), kv_pool.alloc(5)
            write_kv(kv_pool, own, gen)
            slots = torch.cat((prefix, own))
            req_pool.req_to_token[idx, : len(slots)] = slots
            live[idx] = slots.tolist()
    keys = []
    for step in range(6):
        if step == 3:  # a slot is freed (an eviction elsewhere) and the prefixes' slots rewritten
            kv_pool.free(kv_pool.alloc(1))
            write_kv(kv_pool, torch.tensor(live[next(iter(live))][:100]), gen)
        batch = list(live)
        decode_step(keeping, plain, req_pool, kv_pool, live, batch, gen)
        assert keeping._shared is not None and keeping._prefix_key is not None
        keys.append(keeping._prefix_key)
    assert keys[0] is keys[1] is keys[2]  # kept
    assert keys[3] is not keys[2] and keys[3] is keys[4]  # dropped after the free, then kept again
