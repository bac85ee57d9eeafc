"""DeepseekV32ForCausalLM (DeepSeek Sparse Attention) against transformers on a tiny random
checkpoint (fp32) whose indexer keeps 12 tokens, well below the prompts: over the latent pool with
the indexer's keys beside each latent (harness), and through the Engine: a prompt decoding past
the top-k, a batch of lengths, a chunked prefill, a second turn from the radix cache."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm import Engine
from radixlm.cache.mla_pool import MLATokenToKVPool
from radixlm.model.loader import load_model
from tests.conftest import engine_args
from tests.model.deepseek_refs import SPARSE_CONFIGS, MLAHarness, make_hf, save_hf
from tests.model.deepseek_refs import assert_matches_hf as _assert_matches
from tests.model.deepseek_refs import hf_reference as _reference
from tests.model.deepseek_refs import random_prompts as _prompts
from tests.model.helpers import hf_logits

ATOL = 1e-4  # test_deepseek.py's
TOPK = 12
NEW = 24
SP = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=list(SPARSE_CONFIGS))
def models(request, tmp_path_factory):
    hf, cfg = make_hf(request.param)
    assert cfg.index_topk == TOPK
    path = tmp_path_factory.mktemp(f"deepseek-{request.param}")
    hf.save_pretrained(path)
    loaded = load_model(str(path))
    assert loaded.architecture == "DeepseekV32ForCausalLM"
    return hf, loaded


def _dense_twin(hf):
    """HF's DeepSeek-V3 with the same weights (its indexers dropped): dense attention."""
    cfg = transformers.DeepseekV3Config(
        **{
            k: getattr(hf.config, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "moe_intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "n_shared_experts",
                "n_routed_experts",
                "num_experts_per_tok",
                "kv_lora_rank",
                "q_lora_rank",
                "qk_rope_head_dim",
                "v_head_dim",
                "qk_nope_head_dim",
                "first_k_dense_replace",
                "max_position_embeddings",
                "rms_norm_eps",
                "n_group",
                "topk_group",
                "norm_topk_prob",
                "routed_scaling_factor",
                "tie_word_embeddings",
                "rope_parameters",
            )
        }
    )
    dense = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    state = {k: v for k, v in hf.state_dict().items() if ".indexer." not in k}
    missing, unexpected = dense.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return dense


def test_pool_keeps_the_indexer_key_beside_the_latent(models):
    from radixlm.model.memory.kv_layout import kv_layout
    from radixlm.model.model_summary import summary

    hf, loaded = models
    cfg = loaded.hf_config
    h = MLAHarness(loaded.model, cfg)
    assert isinstance(h.kv_pool, MLATokenToKVPool)
    row = cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim
    assert h.kv_pool.head_dim == row
    assert h.kv_pool.get_index_k_buffer(0).shape[-1] == cfg.index_head_dim
    assert h.kv_pool.get_latent_buffer(0).shape[-1] == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    layout = kv_layout(loaded.model, cfg)
    L = cfg.num_hidden_layers
    assert layout.bytes_per_token(L, torch.float32) == L * row * 4
    line = summary(loaded.architecture, loaded.model, cfg, layout, L, torch.float32)
    assert f"MLA latent 32+8 + indexer key {cfg.index_head_dim}" in line


@pytest.mark.parametrize("absorb", [True, False], ids=["absorbed-decode", "decompressed-decode"])
def test_logits_prefill_shared_prefix_and_decode(models, absorb):
    """One extend batch (prompts of 9 to 40 tokens), a request extending the second one's cached
    20 tokens (their indexer keys read from the pool, not recomputed), then two decode steps: every
    row equals transformers' logits; the selection prunes (HF with every token kept differs)."""
    hf, loaded = models
    h = MLAHarness(loaded.model, loaded.hf_config, absorb=absorb)
    seqs = _prompts([9, 33, 40], seed=5)
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-2] for s in seqs])
    shared = h.new_request(share_prefix_of=reqs[1], prefix_len=20)
    tail = _prompts([15], seed=6)[0]
    seqs.append(seqs[1][:20] + tail)
    reqs.append(shared)
    outs.append(torch.cat([torch.zeros(20, outs[0].shape[1]), h.extend([shared], [tail[:-2]])[0]]))
    for step in (2, 1):
        dec = h.decode(reqs, [s[-step] for s in seqs])
        outs = [torch.cat([o, d[None]]) for o, d in zip(outs, dec)]
    for i, (s, o) in enumerate(zip(seqs, outs)):
        ref = hf_logits(hf, s)
        lo = 20 if i == 3 else 0
        diff = (o[lo:] - ref[lo:]).abs().max().item()
        assert ref.abs().max() > 1.0
        assert diff < ATOL, f"request {i}: max|diff| {diff:.2e}"
    dense = hf_logits(_dense_twin(hf), seqs[2])
    assert (dense[TOPK:] - hf_logits(hf, seqs[2])[TOPK:]).abs().max() > 1e-2
    assert (dense[:TOPK] - hf_logits(hf, seqs[2])[:TOPK]).abs().max() < ATOL


def test_shorter_than_topk_equals_dense_attention(models):
    """A 9-token prompt and 3 decode steps (12 tokens, the top-k): every token is kept, so the
    logits are HF's dense DeepSeek-V3's with the same weights."""
    hf, loaded = models
    seq = _prompts([TOPK], seed=8)[0]
    h = MLAHarness(loaded.model, loaded.hf_config)
    (req,) = [h.new_request()]
    out = h.extend([req], [seq[:-3]])[0]
    for t in seq[-3:]:
        out = torch.cat([out, h.decode([req], [t])])
    ref = hf_logits(_dense_twin(hf), seq)
    assert (out - ref).abs().max().item() < ATOL


# --- through the Engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, default_model_path):
    return save_hf("v32", tmp_path_factory.mktemp("deepseek-v32-engine"), default_model_path)


@pytest.fixture(scope="module")
def engine(checkpoint):
    path, hf, cfg = checkpoint
    with Engine(path, **engine_args()) as e:
        yield e


def test_long_prompt_decodes_past_topk_and_batch(engine, checkpoint):
    """A 40-token prompt alone (24 tokens decoded, every step pruned to 12), then prompts of 5 to
    44 tokens in one batch: HF's greedy tokens and log-probabilities."""
    path, hf, cfg = checkpoint
    info = engine.scheduler_info
    assert info["architecture"] == "DeepseekV32ForCausalLM"
    row = cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim  # the indexer's key too
    assert (
        info["kv_cache_bytes"]
        == (info["max_total_num_tokens"] + 1) * cfg.num_hidden_layers * row * 4
    )
    prompts = _prompts([40, 5, 17, 30, 44], seed=9)
    refs = [_reference(hf, p) for p in prompts]
    out = engine.generate(input_ids=prompts[0], sampling_params=SP, return_logprob=True)
    _assert_matches(out, prompts[0], refs[0], "alone")
    assert engine.flush_cache()
    outs = engine.generate(input_ids=prompts[1:], sampling_params=SP, return_logprob=True)
    for i, o in enumerate(outs):
        _assert_matches(o, prompts[1 + i], refs[1 + i], f"batched #{i}")


def test_second_turn_from_the_radix_cache(engine, checkpoint):
    """A second turn (the first's prompt and answer, then 7 new tokens) starts from the tree:
    cached tokens > 0, and HF's tokens on the whole sequence."""
    path, hf, cfg = checkpoint
    assert engine.flush_cache()
    first = _prompts([30], seed=10)[0]
    out = engine.generate(input_ids=first, sampling_params=SP)
    second = first + out["output_ids"] + _prompts([7], seed=11)[0]
    ref = _reference(hf, second)
    out = engine.generate(input_ids=second, sampling_params=SP, return_logprob=True)
    assert out["meta_info"]["cached_tokens"] >= len(first)
    _assert_matches(out, second, ref, "second turn")


def test_chunked_prefill(checkpoint):
    """Prefill in chunks of 8 tokens: each chunk's queries rank the earlier chunks' indexer keys
    from the pool."""
    path, hf, cfg = checkpoint
    prompts = _prompts([44, 27], seed=12)
    refs = [_reference(hf, p) for p in prompts]
    with Engine(path, **engine_args(chunked_prefill_size=8)) as e:
        for p, ref in zip(prompts, refs):
            out = e.generate(input_ids=p, sampling_params=SP, return_logprob=True)
            _assert_matches(out, p, ref, f"chunked {len(p)}")


@pytest.mark.parametrize(
    "field, value",
    [("index_topk", 0), ("index_head_dim", None), ("index_n_heads", -1), ("q_lora_rank", None)],
)
def test_bad_config_is_refused_by_field(field, value):
    """A config.json's bad value (HF's own class would refuse some itself): an error naming it."""
    from types import SimpleNamespace

    from radixlm.model.models.deepseek_v32 import check_config

    good = SPARSE_CONFIGS["v32"]().to_dict()
    check_config(SimpleNamespace(**good))
    with pytest.raises(ValueError, match=field):
        check_config(SimpleNamespace(**{**good, field: value}))
    with pytest.raises(ValueError, match="index_head_dim"):
        check_config(SimpleNamespace(**{**good, "index_head_dim": good["qk_rope_head_dim"] - 2}))


# --- from GGUF ------------------------------------------------------------------------------------


def test_gguf_deepseek32_logits_and_greedy(models, tmp_path):
    """llama.cpp's `deepseek32` file (the converter's DeepseekV32Model: deepseek2's layout, kv_b
    split per head, the indexer's tensors and keys): logits within 1e-4 of transformers on prompts
    past the top-k, and 24 greedy tokens of HF's."""
    from tests.model import test_deepseek_gguf as dsgguf

    hf, _ = models
    path = str(tmp_path / "v32.gguf")
    dsgguf.write_deepseek2_gguf(path, hf, hf.config, split_kv_b=True)
    loaded = load_model(path)
    assert loaded.architecture == "DeepseekV32ForCausalLM"
    c = loaded.hf_config
    for key in ("index_topk", "index_head_dim", "index_n_heads", "q_lora_rank", "n_group"):
        assert getattr(c, key) == getattr(hf.config, key), key
    h = MLAHarness(loaded.model, c)
    seqs = _prompts([11, 40], seed=13)
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-1] for s in seqs])
    dec = h.decode(reqs, [s[-1] for s in seqs])
    for s, o, d in zip(seqs, outs, dec):
        assert (torch.cat([o, d[None]]) - hf_logits(hf, s)).abs().max().item() < ATOL
    prompt = _prompts([30], seed=14)[0]
    gen, _ = _reference(hf, prompt)
    h = MLAHarness(loaded.model, c)
    r = h.new_request()
    toks = [int(h.extend([r], [prompt])[0][-1].argmax())]
    for _ in range(NEW - 1):
        toks.append(int(h.decode([r], [toks[-1]])[0].argmax()))
    assert toks == gen


def test_scores_in_query_blocks_select_the_same(monkeypatch):
    """A long prefill scores its queries in blocks (SCORE_BLOCK_ELEMS): blocks of 3 rows keep the
    same tokens as one block, shared keys or per-query ones."""
    from radixlm.model.layers.attention import nsa_indexer

    g = torch.Generator().manual_seed(3)
    s, heads, d, length = 10, 4, 16, 30
    q, keys = torch.randn(s, heads, d, generator=g), torch.randn(length, d, generator=g)
    w = torch.randn(s, heads, generator=g)
    visible = torch.arange(length)[None, :] <= torch.arange(20, 20 + s)[:, None]
    whole = nsa_indexer.select_topk(q, w, keys, visible, TOPK)
    assert whole.sum(-1).tolist() == [TOPK] * s
    monkeypatch.setattr(nsa_indexer, "SCORE_BLOCK_ELEMS", 3 * heads * length)
    assert torch.equal(nsa_indexer.select_topk(q, w, keys, visible, TOPK), whole)
    per_query = keys.expand(s, -1, -1)
    assert torch.equal(nsa_indexer.select_topk(q, w, per_query, visible, TOPK), whole)


def test_hierarchical_cache_and_retraction_carry_the_indexer_keys(checkpoint, tmp_path):
    """A document's latents and indexer keys (one pool row) go to L2 and L3 and come back after
    the pool is flushed and after a restart; a retracted request re-prefills from the tree: every
    output is HF's."""
    from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler

    path, hf, _ = checkpoint
    g = torch.Generator().manual_seed(15)
    doc = torch.randint(3, 256, (64,), generator=g).tolist()
    ps = [doc + torch.randint(3, 256, (10,), generator=g).tolist() for _ in range(2)]
    ref = _reference(hf, ps[1], 8)[0]
    sp = dict(max_new_tokens=8, temperature=0, ignore_eos=True)
    opts = dict(
        enable_hierarchical_cache=True,
        max_total_tokens=600,
        hicache_dtype="float32",
        hicache_storage_backend="file",
        hicache_storage_dir=str(tmp_path),
        hicache_storage_chunk_size=32,
    )
    d = Driver(make_scheduler(path, **opts))
    d.submit(ps[0], "a", **sp)
    d.run()
    d.s.tree_cache.storage_tier.wait_writes()
    assert d.s.flush_cache("l1").success
    d.submit(ps[1], "b", **sp)
    d.run()
    assert d.results["b"].output_ids == ref and d.results["b"].cached_tokens == 64
    assert d.s.tree_cache.stats.l2_hit_tokens >= 64
    assert_idle_memory_ok(d.s)
    d.s.tree_cache.close()
    d2 = Driver(make_scheduler(path, **opts))  # a restart: L3 only
    d2.submit(ps[1], "c", **sp)
    d2.run()
    assert d2.results["c"].output_ids == ref and d2.s.tree_cache.stats.l3_hit_tokens == 64
    d2.s.tree_cache.close()

    r_ids, a_ids = (torch.randint(3, 256, (n,), generator=g).tolist() for n in (20, 110))
    d3 = Driver(make_scheduler(path, chunked_prefill_size=32, max_total_tokens=120))
    d3.submit(r_ids, "R", max_new_tokens=90, temperature=0, ignore_eos=True)
    d3.step()
    d3.submit(a_ids, "A", max_new_tokens=1, temperature=0, ignore_eos=True)
    d3.run()
    assert d3.s.stats.num_retracted >= 1
    assert d3.results["R"].output_ids == _reference(hf, r_ids, 90)[0]
    assert d3.results["A"].output_ids == _reference(hf, a_ids, 1)[0]
    assert_idle_memory_ok(d3.s)


def test_mixed_chunk_prefill_beside_decode(checkpoint):
    """--enable-mixed-chunk: a 40-token prompt's prefill in the same forward as a running
    request's decode rows (each part ranks its own tokens): both get HF's tokens."""
    from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler

    path, hf, _ = checkpoint
    r_ids, a_ids = _prompts([20, 40], seed=16)
    d = Driver(make_scheduler(path, enable_mixed_chunk=True, max_total_tokens=600))
    d.submit(r_ids, "R", max_new_tokens=30, temperature=0, ignore_eos=True)
    d.step()
    d.step()
    d.submit(a_ids, "A", max_new_tokens=8, temperature=0, ignore_eos=True)
    d.run()
    assert d.s.stats.mixed_steps >= 1
    assert d.results["R"].output_ids == _reference(hf, r_ids, 30)[0]
    assert d.results["A"].output_ids == _reference(hf, a_ids, 8)[0]
    assert_idle_memory_ok(d.s)
