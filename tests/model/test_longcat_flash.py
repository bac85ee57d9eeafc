"""LongcatFlashForCausalLM against transformers on a tiny random checkpoint (fp32, 2 layers of two
MLA sub-layers each, 4 real experts + 2 zero-computation experts, top-2, so tokens are routed to
zero experts): logits over the latent pool (harness), and through the Engine: a prompt alone, a
batch of lengths, a chunked prefill, a second turn from the radix cache, DP attention with the
experts split over 2 ranks."""

from __future__ import annotations

import pytest
import torch

from radixlm import Engine
from radixlm.model.layers.moe.zero_experts import zero_experts_compute
from radixlm.model.loader import load_model
from tests.conftest import engine_args
from tests.model.deepseek_refs import YARN, MLAHarness, one_thread  # noqa: F401 (a fixture)
from tests.model.deepseek_refs import assert_matches_hf as _assert_matches
from tests.model.deepseek_refs import hf_reference as _reference
from tests.model.deepseek_refs import random_prompts as _prompts
from tests.model.helpers import hf_logits
from tests.model.longcat_refs import CONFIG, make_hf, routed_ids, save_hf

ATOL = 1e-4  # test_deepseek.py's
NEW = 24
SP = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
REAL = CONFIG["n_routed_experts"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    hf, cfg = make_hf()
    path = tmp_path_factory.mktemp("longcat-flash")
    hf.save_pretrained(path)
    loaded = load_model(str(path))
    assert loaded.architecture == "LongcatFlashForCausalLM"
    return hf, loaded


def test_summary_names_the_zero_experts(models):
    from radixlm.model.memory.kv_layout import kv_layout
    from radixlm.model.model_summary import parameter_counts, summary

    _, loaded = models
    cfg = loaded.hf_config
    layout = kv_layout(loaded.model, cfg)
    line = summary(loaded.architecture, loaded.model, cfg, layout, 4, torch.float32)
    assert "4 routed experts, top-2, 2 zero-computation" in line
    assert "MLA latent 32+8" in line
    total, active = parameter_counts(loaded.model)
    experts = sum(
        p.numel() for layer in loaded.model.model.layers for p in layer.mlp.experts.parameters()
    )
    assert total - active == experts // 2  # top-2 of 4 real experts at most


def test_tokens_do_reach_zero_experts(models):
    """HF's routers send some slots to zero experts, some tokens to no real expert at all."""
    hf, _ = models
    ids = routed_ids(hf, _prompts([40], seed=5)[0])
    zero = ids >= REAL
    assert 0 < zero.sum() < zero.numel()
    assert zero.all(-1).any()


@pytest.mark.parametrize("absorb", [True, False], ids=["absorbed-decode", "decompressed-decode"])
def test_logits_prefill_shared_prefix_and_decode(models, absorb):
    """One extend batch (prompts of 9 to 40 tokens), a request extending the second one's cached
    20 tokens, then two decode steps: every row equals transformers' logits."""
    hf, loaded = models
    cfg = loaded.hf_config
    assert cfg.num_hidden_layers == 2 * cfg.num_layers  # the pool's MLA layers: two per layer
    h = MLAHarness(loaded.model, cfg, absorb=absorb)
    seqs = _prompts([9, 33, 40], seed=5)
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-2] for s in seqs])
    shared = h.new_request(share_prefix_of=reqs[1], prefix_len=20)
    seqs.append(seqs[1][:20] + _prompts([15], seed=6)[0])
    reqs.append(shared)
    outs.append(
        torch.cat([torch.zeros(20, outs[0].shape[1]), h.extend([shared], [seqs[3][20:-2]])[0]])
    )
    for step in (2, 1):
        dec = h.decode(reqs, [s[-step] for s in seqs])
        outs = [torch.cat([o, d[None]]) for o, d in zip(outs, dec)]
    for i, (s, o) in enumerate(zip(seqs, outs)):
        ref = hf_logits(hf, s)
        lo = 20 if i == 3 else 0
        assert ref.abs().max() > 1.0
        diff = (o[lo:] - ref[lo:]).abs().max().item()
        assert diff < ATOL, f"request {i}: max|diff| {diff:.2e}"


def _check_logits(hf, model, config, seqs) -> None:
    """A prefill of seqs but their last tokens, then one decode step: transformers' logits."""
    h = MLAHarness(model, config)
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-1] for s in seqs])
    dec = h.decode(reqs, [s[-1] for s in seqs])
    for s, o, d in zip(seqs, outs, dec):
        diff = (torch.cat([o, d[None]]) - hf_logits(hf, s)).abs().max().item()
        assert diff < ATOL, f"{len(s)} tokens: max|diff| {diff:.2e}"


@pytest.mark.parametrize(
    "overrides",
    [
        {"rope_parameters": YARN},
        # HF's router multiplies by classifier.weight alone: the (random) bias loads, unused
        {"router_bias": True},
    ],
    ids=["yarn", "router-bias"],
)
def test_config_variants(overrides, tmp_path):
    hf, _ = make_hf(**overrides)
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    _check_logits(hf, loaded.model, loaded.hf_config, _prompts([9, 40], seed=7))


def test_stacked_experts_as_transformers_holds_them(models):
    """transformers' in-memory names (mlp.experts.gate_up_proj over real + zero experts,
    down_proj over the real ones) load too: the zero experts' rows are dropped."""
    hf, loaded = models
    for layer in loaded.model.model.layers:
        layer.mlp.experts.w13.data.zero_()
        layer.mlp.experts.w2.data.zero_()
    state = hf.state_dict()
    assert state["model.layers.0.mlp.experts.gate_up_proj"].shape[0] == REAL + 2
    loaded.model.load_weights(list(state.items()))
    _check_logits(hf, loaded.model, loaded.hf_config, _prompts([25], seed=8))


def test_zero_experts_never_reach_the_fused_experts(models, monkeypatch):
    """The real experts see ids < n_routed_experts or -1 (skipped) only; the zero experts' output
    is the input times their summed weights."""
    hf, loaded = models
    seen = []
    experts = [layer.mlp.experts for layer in loaded.model.model.layers]
    cls = type(experts[0])
    forward = cls.forward

    def spy(self, hidden, weights, ids):
        seen.append(ids.clone())
        return forward(self, hidden, weights, ids)

    monkeypatch.setattr(cls, "forward", spy)
    h = MLAHarness(loaded.model, loaded.hf_config)
    h.extend([h.new_request()], _prompts([40], seed=5))
    ids = torch.cat([s.reshape(-1) for s in seen])
    assert ids.max() < REAL and (ids == -1).any()

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 8, generator=g), torch.rand(3, 2, generator=g)
    i = torch.tensor([[0, 4], [5, 4], [1, 2]])
    w2, i2, out = zero_experts_compute(x, w, i, REAL)
    assert i2.tolist() == [[0, -1], [-1, -1], [1, 2]]
    assert torch.equal(w2, torch.where(i >= REAL, torch.zeros_like(w), w))
    torch.testing.assert_close(out, x * torch.tensor([w[0, 1], w[1].sum(), 0.0])[:, None])


# --- through the Engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, default_model_path):
    return save_hf(tmp_path_factory.mktemp("longcat-flash-engine"), default_model_path)


@pytest.fixture(scope="module")
def engine(checkpoint):
    path, hf, cfg = checkpoint
    with Engine(path, **engine_args()) as e:
        yield e


def test_alone_and_batched(engine, checkpoint):
    """A 40-token prompt alone, then prompts of 5 to 44 tokens in one batch: HF's greedy tokens
    and log-probabilities; the pool holds one latent + RoPE key per MLA sub-layer."""
    path, hf, cfg = checkpoint
    info = engine.scheduler_info
    assert info["architecture"] == "LongcatFlashForCausalLM"
    row = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    assert (
        info["kv_cache_bytes"] == (info["max_total_num_tokens"] + 1) * 2 * cfg.num_layers * row * 4
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
    """Prefill in chunks of 8 tokens: each chunk attends the earlier chunks' latents."""
    path, hf, cfg = checkpoint
    prompts = _prompts([44, 27], seed=12)
    refs = [_reference(hf, p) for p in prompts]
    with Engine(path, **engine_args(chunked_prefill_size=8)) as e:
        for p, ref in zip(prompts, refs):
            out = e.generate(input_ids=p, sampling_params=SP, return_logprob=True)
            _assert_matches(out, p, ref, f"chunked {len(p)}")


def test_dp_attention_with_the_experts_split(checkpoint):
    """--enable-dp-attention --dp-size 2 --tp-size 2 --ep-size 2: a request on each rank, each
    rank's tokens gathered through the other's real experts (zero experts stay on their own rank),
    the shorter one's rank idling through the other's decode steps: HF's greedy tokens."""
    path, hf, cfg = checkpoint
    a, b = _prompts([30, 12], seed=21)
    refs = [_reference(hf, p, n)[0] for p, n in ((a, 12), (b, 4))]
    sps = [dict(SP, max_new_tokens=n) for n in (12, 4)]
    args = engine_args(tp_size=2, dp_size=2, enable_dp_attention=True, ep_size=2)
    with Engine(path, **args) as e:
        outs = e.generate(input_ids=[a, b], sampling_params=sps)
        ranks = e.get_internal_state()["dp_ranks"]
    assert [o["output_ids"] for o in outs] == refs
    assert sorted(r["prompt_tokens"] for r in ranks) == [len(b), len(a)]  # one on each rank


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_layers", 0),
        ("n_routed_experts", None),
        ("moe_topk", 7),
        ("zero_expert_num", -1),
        ("q_lora_rank", None),
        ("expert_ffn_hidden_size", 0),
        ("head_dim", 16),
        ("qk_head_dim", 20),
        ("hidden_act", "gelu"),
        ("zero_expert_type", "const"),
        ("mla_scale_kv_lora", False),
    ],
)
def test_bad_config_is_refused_by_field(field, value):
    """A config.json's bad value: an error naming the field."""
    from types import SimpleNamespace

    import transformers

    from radixlm.model.models.longcat_flash import check_config

    good = transformers.LongcatFlashConfig(**CONFIG).to_dict()
    check_config(SimpleNamespace(**good))
    with pytest.raises(ValueError, match=field):
        check_config(SimpleNamespace(**{**good, field: value}))
