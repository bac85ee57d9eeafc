"""TorchSDPABackend's decode paths give exactly the attention of the gather path. The decode KV
mirror does while decode batches change under it: requests join and leave, request slots are
reused, a request's KV grows outside decode (an extend after a jump-forward), capacity grows, and
batches too big for its budget fall back. A batch goes to the first enabled path that plans it, and
the mirror and the kept shared-prefix K/V hold their shared budget one at a time."""

import dataclasses
import random

import pytest
import torch

from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention import RadixAttention, TorchSDPABackend
from radixlm.model.layers.attention.decode_kv_mirror_path import (
    DecodeKVMirrorPath,
    MirrorDecodePlan,
    MirrorReleasePlan,
)
from radixlm.model.layers.attention.gather_decode_path import GatherDecodePath, GatherDecodePlan
from radixlm.model.layers.attention.shared_prefix_decode_path import (
    SharedPrefixDecodePath,
    SharedPrefixDecodePlan,
)

LAYERS, KVH, HEADS, D = 2, 2, 4, 8


def write_kv(kv_pool, slots, gen):
    for layer in range(LAYERS):
        k = torch.randn(len(slots), KVH, D, generator=gen)
        kv_pool.set_kv_buffer(layer, slots, k, torch.randn(len(slots), KVH, D, generator=gen))


def new_step(req_pool, kv_pool, live, batch):
    """A decode step of `batch` (request slots; `live` maps each to its KV slots, extended here):
    its new slots written into the rows, as the scheduler does at launch."""
    out = kv_pool.alloc(len(batch))
    for idx, slot in zip(batch, out.tolist()):
        req_pool.req_to_token[idx, len(live[idx])] = slot
        live[idx].append(slot)
    seq_lens = [len(live[i]) for i in batch]
    return ForwardBatch(
        ForwardMode.DECODE,
        len(batch),
        torch.zeros(len(batch), dtype=torch.int64),
        torch.tensor(seq_lens) - 1,
        torch.tensor(batch),
        torch.tensor(seq_lens),
        out,
        req_pool,
        kv_pool,
        seq_lens_cpu=seq_lens,
    )


def run_step(tested, reference, fb, gen):
    """Run a step planned earlier (fb holds `tested`'s metadata) through both backends, every
    layer's attention compared; the reference plans at run time."""
    ref_fb = dataclasses.replace(fb, attn_metadata=None)
    reference.init_forward_metadata(ref_fb)
    tested.begin_forward(fb)
    for i in range(LAYERS):
        layer = RadixAttention(HEADS, D, D**-0.5, KVH, i)
        q = torch.randn(fb.batch_size, HEADS, D, generator=gen)
        k, v = (
            torch.randn(fb.batch_size, KVH, D, generator=gen),
            torch.randn(fb.batch_size, KVH, D, generator=gen),
        )
        fb.token_to_kv_pool.set_kv_buffer(i, fb.out_cache_loc, k, v)
        torch.testing.assert_close(
            tested.forward_decode(q, k, v, layer, fb),
            reference.forward_decode(q, k, v, layer, ref_fb),
            rtol=1e-5,
            atol=1e-5,
        )


def decode_step(tested, reference, req_pool, kv_pool, live, batch, gen):
    fb = new_step(req_pool, kv_pool, live, batch)
    tested.init_forward_metadata(fb)
    run_step(tested, reference, fb, gen)
    return fb.attn_metadata


def mirror_plan(md):
    """The batch's MirrorPlan, or None where the batch went to another path."""
    return md.decode.mirror if isinstance(md.decode, MirrorDecodePlan) else None


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
    for _step in range(120):
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
        md = decode_step(mirrored, plain, req_pool, kv_pool, live, batch, gen)
        plan = mirror_plan(md)
        assert plan is not None or isinstance(md.decode, GatherDecodePlan)
        used_mirror += plan is not None
        fell_back += plan is None
        in_order += plan is not None and plan.row_of is None  # rows need no reordering
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
    for _g in range(2):  # two groups of three requests, each sharing a 100-token prefix
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
        md = decode_step(keeping, plain, req_pool, kv_pool, live, batch, gen)
        assert isinstance(md.decode, SharedPrefixDecodePlan) and md.decode.prefix_kv is not None
        keys.append(md.decode.prefix_kv)
    assert keys[0] is keys[1] is keys[2]  # kept
    assert keys[3] is not keys[2] and keys[3] is keys[4]  # dropped after the free, then kept again


@pytest.mark.parametrize("seed", [3, 4])
def test_mirror_planned_a_step_ahead_matches_gather_path(seed):
    """The overlap scheduler plans step N+1 (rows, fills, moves) while step N has not run yet; the
    data moves then run in launch order. Requests join, leave and reorder between the two."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    req_pool, kv_pool = ReqToTokenPool(12, 700), TokenToKVPool(6000, LAYERS, KVH, D)
    per_token = LAYERS * 2 * KVH * D * 4
    mirrored = TorchSDPABackend(shared_prefix=False, mirror_bytes=6 * 300 * per_token)
    plain = TorchSDPABackend(shared_prefix=False)
    live: dict[int, list[int]] = {}
    pending, leaving = (
        None,
        [],
    )  # the step planned but not run yet; requests it still uses that left
    fills = moves = 0
    for _step in range(80):
        if (
            len(live) > 2 and rng.random() < 0.5
        ):  # a request leaves: not in the next plan, freed later
            idx = rng.choice(list(live))
            leaving.append((idx, live.pop(idx)))
        while len(live) < 2 or (len(live) < 8 and rng.random() < 0.3):
            idx, n = req_pool.alloc(), rng.randrange(1, 100)
            slots = kv_pool.alloc(n)
            write_kv(kv_pool, slots, gen)
            req_pool.req_to_token[idx, :n] = slots
            live[idx] = slots.tolist()
        batch = rng.sample(list(live), len(live)) if rng.random() < 0.3 else list(live)
        fb = new_step(req_pool, kv_pool, live, batch)
        mirrored.init_forward_metadata(fb)  # planned before the previous step ran
        plan = mirror_plan(fb.attn_metadata)
        fills += len(plan.fills) if plan is not None else 0
        moves += len(plan.moves) if plan is not None else 0
        if pending is not None:
            run_step(mirrored, plain, pending, gen)
        for (
            idx,
            slots,
        ) in leaving:  # the step that used them has run: their frees were deferred till now
            kv_pool.free(torch.tensor(slots))
            req_pool.free(idx)
        leaving, pending = [], fb
    run_step(mirrored, plain, pending, gen)
    assert fills > 5 and moves > 0


def add_request(req_pool, kv_pool, live, gen, n, prefix=None):
    """A request of n own tokens after `prefix` (KV slots of a cached prefix it shares)."""
    idx, own = req_pool.alloc(), kv_pool.alloc(n)
    write_kv(kv_pool, own, gen)
    slots = own if prefix is None else torch.cat((prefix, own))
    req_pool.req_to_token[idx, : len(slots)] = slots
    live[idx] = slots.tolist()
    return idx


@pytest.mark.parametrize("shared_prefix", [True, False], ids=["shared", "no-shared"])
@pytest.mark.parametrize("mirror_bytes", [1 << 24, 0], ids=["mirror", "no-mirror"])
def test_batch_goes_to_the_first_path_that_plans_it(shared_prefix, mirror_bytes):
    """The flags make the path list; a batch whose requests share a prefix takes the shared-prefix
    path, one whose requests do not takes the mirror (else the gather), each with the gather's
    attention; the kept prefix K/V and the mirror take their budget from each other."""
    gen = torch.Generator().manual_seed(5)
    req_pool, kv_pool = ReqToTokenPool(8, 400), TokenToKVPool(3000, LAYERS, KVH, D)
    backend = TorchSDPABackend(shared_prefix=shared_prefix, mirror_bytes=mirror_bytes)
    gather_only = TorchSDPABackend(shared_prefix=False)
    assert [type(p) for p in gather_only.decode_paths] == [GatherDecodePath]
    want = (
        [SharedPrefixDecodePath] * shared_prefix
        + [DecodeKVMirrorPath] * bool(mirror_bytes)
        + [GatherDecodePath]
    )
    assert [type(p) for p in backend.decode_paths] == want
    mirror = next((p for p in backend.decode_paths if isinstance(p, DecodeKVMirrorPath)), None)

    live = {}
    prefix = kv_pool.alloc(100)
    write_kv(kv_pool, prefix, gen)
    sharing = [add_request(req_pool, kv_pool, live, gen, n, prefix) for n in (3, 7, 5)]
    alone = [add_request(req_pool, kv_pool, live, gen, n) for n in (40, 90, 12)]
    unshared = GatherDecodePlan if mirror is None else MirrorDecodePlan
    kept = []  # the shared-prefix plans' kept prefix K/V, per step
    for _run in range(3):
        for step in range(2):  # the same prefixes in consecutive steps: the prefix K/V are kept
            md = decode_step(
                backend, gather_only, req_pool, kv_pool, live, sharing, gen
            )  # outputs compared
            assert type(md.decode) is (SharedPrefixDecodePlan if shared_prefix else unshared)
            if shared_prefix:
                kept.append(md.decode.prefix_kv)
            if (
                shared_prefix and mirror is not None
            ):  # the mirror's memory goes when the prefix K/V are kept
                assert md.decode.prefix_kv is not None and mirror.mirror.k == []
                assert [type(r) for r in md.releases] == [MirrorReleasePlan] * (step == 0)
        md = decode_step(backend, gather_only, req_pool, kv_pool, live, alone, gen)
        assert type(md.decode) is unshared and md.releases == []
        if mirror is not None:
            assert len(mirror.mirror.k) == LAYERS  # the mirror holds rows
    if (
        shared_prefix and mirror is not None
    ):  # kept within a run; dropped when the mirror took the budget
        assert all(kept[i] is kept[i + 1] for i in (0, 2, 4))
        assert kept[0] is not kept[2] and kept[2] is not kept[4]
    elif shared_prefix:  # no budget: nothing kept
        assert kept == [None] * 6
