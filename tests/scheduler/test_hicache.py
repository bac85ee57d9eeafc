"""Hierarchical cache in the scheduler (tiny model, in-process): a prefix restored from L2 or L3
gives the greedy tokens and logprobs of recomputing it, across restarts, eviction pressure, chunked
prefill, aborts mid-load, concurrent loads of one node and every KV dtype; damaged or foreign
stored chunks and a full disk are skipped and reported while serving goes on."""

from __future__ import annotations

import errno
import os
import threading

import pytest
import torch

from radixlm.cache.storage import chunk_keys
from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler

PREFIX = 200  # tokens of the shared document
CHUNK = 32
N_OUT = 8
# Stated rounding: float16 L2/L3 copies of a float32 pool (--hicache-dtype auto) move a logprob by
# at most this much on the tiny model (measured 2.5e-3 to 5.3e-3: its peaked logits magnify KV
# error); copies in the pool's own type are exact, leaving only the batch-shape noise of any cache
# hit (1e-4).
FP16_COPY_TOL = 2e-2
EXACT_TOL = 1e-4


def prompts(n: int, seed: int = 0, prefix: int = PREFIX) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    doc = torch.randint(100, 4000, (prefix,), generator=g).tolist()
    return [doc + torch.randint(100, 4000, (12,), generator=g).tolist() for _ in range(n)]


def run(d: Driver, ps: list[list[int]], together: bool = False):
    rids = []
    for p in ps:
        rids.append(
            d.submit(p, max_new_tokens=N_OUT, temperature=0, ignore_eos=True, return_logprob=True)
        )
        if not together:
            d.run()
    d.run()
    out = []
    for rid in rids:
        r = d.results[rid]
        assert r.finishes == 1 and r.finish_reason["type"] == "length", r.finish_reason
        out.append(
            (r.output_ids, torch.tensor([lp[0] for lp in r.output_token_logprobs]), r.cached_tokens)
        )
    return out


def assert_same(got, ref, tol):
    assert len(got) == len(ref)
    for (ids, lps, _), (rids, rlps, _) in zip(got, ref):
        assert ids == rids
        assert torch.allclose(lps, rlps, atol=tol, rtol=0), (lps - rlps).abs().max()


def hicache(model, storage_dir=None, **kw) -> Driver:
    opts = dict(
        enable_hierarchical_cache=True, max_total_tokens=600, hicache_storage_chunk_size=CHUNK
    )
    if storage_dir is not None:
        opts.update(hicache_storage_backend="file", hicache_storage_dir=str(storage_dir))
    return Driver(make_scheduler(model, **{**opts, **kw}))


def reference(model, ps, **kw):
    return run(
        Driver(make_scheduler(model, disable_radix_cache=True, max_total_tokens=2000, **kw)), ps
    )


def finish_writes(d: Driver) -> None:
    d.s.tree_cache.storage_tier.wait_writes()


@pytest.mark.parametrize(
    "kv_dtype,hicache_dtype,tol",
    [
        ("float32", "float32", EXACT_TOL),
        ("float32", "auto", FP16_COPY_TOL),
        ("float16", "auto", EXACT_TOL),
        ("bfloat16", "auto", EXACT_TOL),
        ("int8", "auto", EXACT_TOL),
        ("int4", "auto", EXACT_TOL),
    ],
)
def test_restored_prefix_equals_recompute_every_kv_dtype(
    tiny_model_dir, tmp_path, kv_dtype, hicache_dtype, tol
):
    ps = prompts(2)
    ref = reference(tiny_model_dir, ps[1:], kv_cache_dtype=kv_dtype)
    d = hicache(tiny_model_dir, tmp_path, kv_cache_dtype=kv_dtype, hicache_dtype=hicache_dtype)
    run(d, ps[:1])
    finish_writes(d)
    assert d.s.flush_cache("l1").success  # L1 empty, the document stays in L2
    from_l2 = run(d, ps[1:])
    assert from_l2[0][2] == PREFIX and d.s.tree_cache.stats.l2_hit_tokens >= PREFIX
    assert_same(from_l2, ref, tol)
    assert_idle_memory_ok(d.s)
    d.s.tree_cache.close()

    d2 = hicache(
        tiny_model_dir, tmp_path, kv_cache_dtype=kv_dtype, hicache_dtype=hicache_dtype
    )  # a restart
    from_l3 = run(d2, ps[1:])
    assert (
        from_l3[0][2] == PREFIX // CHUNK * CHUNK
        and d2.s.tree_cache.stats.l3_hit_tokens == PREFIX // CHUNK * CHUNK
    ), d2.s.tree_cache.stats
    assert_same(from_l3, ref, tol)
    assert_idle_memory_ok(d2.s)


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_eviction_pressure_and_chunked_prefill(tiny_model_dir, policy):
    """Four documents (3 questions each, 212 tokens a request) through a 500-token pool, chunked
    prefill of 64, three rounds, requests submitted together: outputs equal recomputation; L2 served
    hits (write_through_selective too: each document is matched often enough to be backed up)."""
    docs = [p for seed in range(4) for p in prompts(3, seed)]
    ref = reference(tiny_model_dir, docs)
    d = hicache(
        tiny_model_dir,
        max_total_tokens=500,
        chunked_prefill_size=64,
        hicache_dtype="float32",
        hicache_write_policy=policy,
        hicache_ratio=4,
    )
    for _ in range(3):
        assert_same(run(d, docs, together=True), ref, EXACT_TOL)
        assert_idle_memory_ok(d.s)
    st = d.s.tree_cache.stats
    assert st.l2_hit_tokens > 0 and st.l1_evicted_tokens > 0


def stored_then_restarted(model, storage_dir, n: int):
    """n prompts on one document: the first answered and stored by one server, the recomputed
    answers of the others, and a new server on the same directory."""
    ps = prompts(n)
    ref = reference(model, ps[1:])
    d = hicache(model, storage_dir)
    run(d, ps[:1])
    finish_writes(d)
    return ps, ref, hicache(model, storage_dir)


def test_concurrent_requests_share_one_load(tiny_model_dir, tmp_path):
    ps, ref, d2 = stored_then_restarted(tiny_model_dir, tmp_path, 4)
    got = run(d2, ps[1:], together=True)
    assert_same(got, ref, FP16_COPY_TOL)
    st = d2.s.tree_cache.stats
    chunk_bytes = CHUNK * d2.s.tree_cache.host_pool.bytes_per_token
    # Three requests, one read of each chunk (reads of a chunk in flight are shared).
    assert st.bytes_from_l3 == (PREFIX // CHUNK) * chunk_bytes
    # The first one admitted loads the stored chunks; the others then find the document in L1.
    assert sorted(c for _, _, c in got) == [PREFIX // CHUNK * CHUNK] + [PREFIX] * 2
    assert_idle_memory_ok(d2.s)


def test_abort_while_loading(tiny_model_dir, tmp_path):
    ps, ref, d2 = stored_then_restarted(tiny_model_dir, tmp_path, 2)
    storage, gate = d2.s.tree_cache.storage_tier.backend, threading.Event()
    real_get = storage.get

    def slow_get(*a):
        gate.wait(10)
        return real_get(*a)

    storage.get = slow_get
    rid = d2.submit(ps[0], max_new_tokens=4, temperature=0)
    assert d2.find(rid) in d2.s.queues.prefetching
    d2.step()
    d2.abort(rid)
    assert d2.results[rid].finish_reason["type"] == "abort"
    gate.set()
    d2.run()
    while (
        d2.s.tree_cache.prefetches
    ):  # the read finishes after the abort: its chunks still land in L2
        d2.step()
    assert_idle_memory_ok(d2.s)
    assert d2.s.tree_cache.check() is None
    got = run(d2, ps[1:])
    assert_same(got, ref, FP16_COPY_TOL)
    assert got[0][2] == PREFIX // CHUNK * CHUNK


def damage(path: str, how: str) -> None:
    blob = bytearray(open(path, "rb").read())
    if how == "truncate":
        blob = blob[: len(blob) - 100]
    else:
        blob[len(blob) // 2] ^= 0xFF
    open(path, "wb").write(blob)


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damaged_chunk_is_skipped(tiny_model_dir, tmp_path, how, caplog):
    ps = prompts(2)
    ref = reference(tiny_model_dir, ps[1:])
    d = hicache(tiny_model_dir, tmp_path)
    run(d, ps[:1])
    finish_writes(d)
    keys = chunk_keys(d.s.tree_cache.storage_tier.model_key, ps[0], CHUNK, PREFIX // CHUNK)
    damage(d.s.tree_cache.storage_tier.backend.path(keys[3]), how)
    d2 = hicache(tiny_model_dir, tmp_path)
    got = run(d2, ps[1:])
    assert_same(got, ref, FP16_COPY_TOL)
    assert got[0][2] == 3 * CHUNK  # the chunks before the damaged one, not one token more
    assert d2.s.tree_cache.stats.corrupt_chunks == 1 and "MAC mismatch" in caplog.text
    assert_idle_memory_ok(d2.s)
    finish_writes(d2)  # the recomputed chunk replaced the damaged file
    assert run(hicache(tiny_model_dir, tmp_path), ps[1:])[0][2] == PREFIX // CHUNK * CHUNK


def test_chunks_of_another_model_are_never_served(tiny_model_dir, tmp_path):
    """Chunks written under another model key (here: float32 copies), renamed to the names this
    server looks up, fail the MAC (it covers the model key): skipped, recomputed."""
    ps = prompts(2)
    ref = reference(tiny_model_dir, ps[1:])
    other = hicache(tiny_model_dir, tmp_path, hicache_dtype="float32")
    run(other, ps[:1])
    finish_writes(other)
    other_keys = chunk_keys(
        other.s.tree_cache.storage_tier.model_key, ps[0], CHUNK, PREFIX // CHUNK
    )
    d = hicache(tiny_model_dir, tmp_path)  # float16 copies: another model key
    assert d.s.tree_cache.storage_tier.model_key != other.s.tree_cache.storage_tier.model_key
    for a, b in zip(
        other_keys,
        chunk_keys(d.s.tree_cache.storage_tier.model_key, ps[0], CHUNK, PREFIX // CHUNK),
        strict=True,
    ):
        os.replace(
            other.s.tree_cache.storage_tier.backend.path(a),
            d.s.tree_cache.storage_tier.backend.path(b),
        )
    got = run(d, ps[1:])
    assert_same(got, ref, FP16_COPY_TOL)
    assert got[0][2] == 0 and d.s.tree_cache.stats.corrupt_chunks == PREFIX // CHUNK


def test_full_disk_keeps_serving(tiny_model_dir, tmp_path, monkeypatch, caplog):
    import radixlm.cache.storage as storage_mod

    def full_disk(dir_fd, name, data):
        raise OSError(errno.ENOSPC, "No space left on device", name)

    monkeypatch.setattr(storage_mod, "write_new", full_disk)
    ps = prompts(3)
    ref = reference(tiny_model_dir, ps)
    d = hicache(tiny_model_dir, tmp_path)
    assert_same(run(d, ps), ref, FP16_COPY_TOL)
    finish_writes(d)
    st = d.s.tree_cache.stats
    assert st.write_errors > 0 and st.l3_chunks_written == 0 and "No space left" in caplog.text
    assert [f for f in os.listdir(tmp_path) if f.endswith(".kv")] == []
    assert_idle_memory_ok(d.s)


def test_flush_levels(tiny_model_dir, tmp_path):
    ps = prompts(2)
    d = hicache(tiny_model_dir, tmp_path)
    run(d, ps[:1])
    finish_writes(d)
    assert not d.s.flush_cache("l4").success
    assert d.s.flush_cache("l1").success
    assert (
        run(d, ps[1:])[0][2] == PREFIX and d.s.tree_cache.stats.l2_hit_tokens == PREFIX
    )  # from L2
    assert d.s.flush_cache("l2").success
    assert d.s.tree_cache.host_size() == 0
    assert run(d, ps[1:2])[0][2] == PREFIX // CHUNK * CHUNK  # from L3
    assert d.s.flush_cache("l3").success
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".kv")]
    assert run(d, ps[1:2])[0][2] == 0
    assert_idle_memory_ok(d.s)


def test_loaded_prefix_then_chunked_prefill(tiny_model_dir, tmp_path):
    """A document from disk, then 150 new tokens prefilled in chunks of 64 on top of it."""
    ps = prompts(1)
    g = torch.Generator().manual_seed(7)
    long_q = ps[0][:PREFIX] + torch.randint(100, 4000, (150,), generator=g).tolist()
    ref = reference(tiny_model_dir, [long_q])
    d = hicache(tiny_model_dir, tmp_path)
    run(d, ps)
    finish_writes(d)
    d2 = hicache(tiny_model_dir, tmp_path, chunked_prefill_size=64)
    got = run(d2, [long_q])
    assert got[0][2] == PREFIX // CHUNK * CHUNK
    assert_same(got, ref, FP16_COPY_TOL)
    assert d2.s.stats.extend_steps >= 3  # 158 computed tokens in chunks of 64
    assert_idle_memory_ok(d2.s)
