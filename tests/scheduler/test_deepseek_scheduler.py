"""A tiny random DeepSeek-V2 (MLA: the latent KV pool) in the scheduler: greedy outputs equal
transformers' with a prefix served from the radix cache, chunked prefill, retraction, and a
prefix restored from the hierarchical cache's L2 (host) and L3 (disk) tiers."""

from __future__ import annotations

import pytest
import torch

from radixlm.cache.mla_pool import MLATokenToKVPool
from tests.model.deepseek_refs import (
    save_hf,
)
from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory, default_model_path):
    path, hf, _ = save_hf("v2", tmp_path_factory.mktemp("deepseek-v2"), default_model_path)
    return path, hf


def hf_greedy(hf, ids, n):
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[
            0, len(ids) :
        ].tolist()


def prompts(n, seed, prefix=100, tail=10):
    g = torch.Generator().manual_seed(seed)
    doc = torch.randint(3, 256, (prefix,), generator=g).tolist()
    return [doc + torch.randint(3, 256, (tail,), generator=g).tolist() for _ in range(n)]


def run(d: Driver, ps, n_out, together=False):
    rids = []
    for p in ps:
        rids.append(d.submit(p, max_new_tokens=n_out, temperature=0, ignore_eos=True))
        if not together:
            d.run()
    d.run()
    for rid in rids:
        assert d.results[rid].finish_reason == {"type": "length", "length": n_out}
    return [d.results[r].output_ids for r in rids], [d.results[r].cached_tokens for r in rids]


def test_radix_prefix_and_chunked_prefill_match_hf(deepseek):
    path, hf = deepseek
    ps = prompts(3, seed=0)
    refs = [hf_greedy(hf, p, 16) for p in ps]
    d = Driver(make_scheduler(path, chunked_prefill_size=32, max_total_tokens=1000))
    assert isinstance(d.s.runner.token_to_kv_pool, MLATokenToKVPool)
    assert repr(d.s.runner.attn_backend).startswith("MLABackend")
    first, _ = run(d, ps[:1], 16)
    rest, cached = run(d, ps[1:], 16, together=True)
    assert first + rest == refs
    assert cached == [100, 100]  # the shared document, from the tree
    assert_idle_memory_ok(d.s)


def test_retraction_keeps_outputs(deepseek):
    """A 120-token pool: a running request (20 + 90) and a 110-token chunked prompt do not fit
    together; retraction requeues one and both end with transformers' tokens."""
    path, hf = deepseek
    g = torch.Generator().manual_seed(3)
    r_ids, a_ids = (torch.randint(3, 256, (n,), generator=g).tolist() for n in (20, 110))
    d = Driver(make_scheduler(path, chunked_prefill_size=32, max_total_tokens=120))
    d.submit(r_ids, "R", max_new_tokens=90, temperature=0, ignore_eos=True)
    d.step()
    d.submit(a_ids, "A", max_new_tokens=1, temperature=0, ignore_eos=True)
    d.run()
    assert d.s.stats.num_retracted >= 1
    assert d.results["R"].output_ids == hf_greedy(hf, r_ids, 90)
    assert d.results["A"].output_ids == hf_greedy(hf, a_ids, 1)
    assert_idle_memory_ok(d.s)


def test_hierarchical_cache_restores_latents(deepseek, tmp_path):
    """The document's latents go to L2 and L3 and come back (float32 copies: exact) after the
    pool is flushed and after a restart: the outputs equal transformers'."""
    path, hf = deepseek
    ps = prompts(2, seed=1, prefix=128)
    ref = hf_greedy(hf, ps[1], 8)
    opts = dict(
        enable_hierarchical_cache=True,
        max_total_tokens=600,
        hicache_dtype="float32",
        hicache_storage_backend="file",
        hicache_storage_dir=str(tmp_path),
        hicache_storage_chunk_size=32,
    )
    d = Driver(make_scheduler(path, **opts))
    run(d, ps[:1], 8)
    d.s.tree_cache.storage_tier.wait_writes()
    assert d.s.flush_cache("l1").success
    out, cached = run(d, ps[1:], 8)
    assert out == [ref] and cached == [128] and d.s.tree_cache.stats.l2_hit_tokens >= 128
    assert_idle_memory_ok(d.s)
    d.s.tree_cache.close()
    d2 = Driver(make_scheduler(path, **opts))  # a restart: L3 only
    out, cached = run(d2, ps[1:], 8)
    assert out == [ref] and cached == [128] and d2.s.tree_cache.stats.l3_hit_tokens == 128
    assert_idle_memory_ok(d2.s)
