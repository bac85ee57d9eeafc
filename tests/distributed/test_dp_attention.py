"""DP attention (--enable-dp-attention --dp-size 2 --tp-size 2, and --ep-size 2) on tiny random
DeepSeek-V2 (softmax, group-limited routing, no q LoRA) and V3 (sigmoid + bias, grouped top-k, q
LoRA) models, 2 real ranks (gloo, shared memory for the forward's gathers):

- the gathered experts: each rank's own tokens through DeepSeek's MoE layer (and the MoE families'
  SparseMoeBlock), the experts split over the ranks, a rank with no tokens joining the others'
  gather, equal the one-process layer;
- the Engine: two concurrent requests land on different ranks (each rank's own prompt-token count
  says which), a third sharing the first's prefix follows it there (served from that rank's radix
  cache), a session's turns stay on one rank, a weight update reaches every rank, greedy tokens
  equal the one-rank engine's and transformers' while one rank idles through the other's decode
  steps; every step's KV ownership checked on each rank (--enable-invariant-checks); after a flush
  every slot of every rank is free.
"""

from __future__ import annotations

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.distributed.ranks import run_ranks
from tests.model.deepseek_refs import CONFIGS, save_hf

# (count of rank 0's tokens, rank 1's) per forward: both, rank 1 idle, rank 0 idle
STEPS = [(5, 3), (4, 0), (0, 2)]


def _moe(dispatch):
    from radixlm.model.models.deepseek_moe import ALL_EXPERTS, DeepseekMoE
    from radixlm.model.models.llama import LlamaMLP

    cfg = CONFIGS["v3"]()
    torch.manual_seed(0)
    shared = LlamaMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
    moe = DeepseekMoE(cfg, True, shared, dispatch)
    g = torch.Generator().manual_seed(3)
    e, i, h = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    with torch.no_grad():
        moe.experts.load_shard(
            moe.experts.w13, torch.randn(e, 2 * i, h, generator=g) * h**-0.5, ALL_EXPERTS
        )
        moe.experts.load_shard(
            moe.experts.w2, torch.randn(e, h, i, generator=g) * i**-0.5, ALL_EXPERTS
        )
        for name, p in moe.named_parameters():
            if not name.startswith("experts."):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return moe, cfg.hidden_size


def _sparse_block(dispatch):
    """A Qwen2-MoE-style SparseMoeBlock (8 experts, top-2, a gated shared expert) of the same hidden
    size."""
    from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
    from radixlm.model.models.llama import LlamaMLP

    h, e, i = 64, 8, 32
    torch.manual_seed(0)
    block = SparseMoeBlock(
        h, MoeSpec(e, 2, i, renormalize=False), 0, shared_expert=LlamaMLP(h, 48), dispatch=dispatch
    )
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        block.load_expert("gate_up", None, torch.randn(e, 2 * i, h, generator=g) * h**-0.5)
        block.load_expert("down", None, torch.randn(e, h, i, generator=g) * i**-0.5)
        for name, p in block.named_parameters():
            if name not in ("w13_weight", "w2_weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return block


def _tokens(step: int, rank: int, n: int, hidden: int) -> torch.Tensor:
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(100 * step + rank))


def _gathered_moe(rank: int) -> list:
    from radixlm.model.layers.moe.expert_dispatch import DPGatheredExperts, expert_dispatch

    dispatch = expert_dispatch()
    assert isinstance(dispatch, DPGatheredExperts)
    moe, hidden = _moe(dispatch)
    block = _sparse_block(dispatch)
    assert moe.experts.w13.shape[0] == 4 and moe.experts.start == 4 * rank  # half of the 8 experts
    assert block.w13_weight.shape[0] == 4 and block.expert_start == 4 * rank
    outs = []
    with torch.no_grad():
        for step, counts in enumerate(STEPS):
            dispatch.begin(counts[rank])  # once per forward, for every MoE layer after it
            if counts[rank]:
                x = _tokens(step, rank, counts[rank], hidden)
                outs.append((moe(x), block(x)))
            else:
                moe.idle(torch.float32)
                block.idle(torch.float32)
                outs.append(None)
    return outs


def test_gathered_experts_equal_one_process():
    from radixlm.model.layers.moe.expert_dispatch import LocalExperts

    torch.set_num_threads(1)
    moe, hidden = _moe(LocalExperts())
    block = _sparse_block(LocalExperts())
    ranks = run_ranks(_gathered_moe, 2, ep=2, dp_attention=True)
    with torch.no_grad():
        for step, counts in enumerate(STEPS):
            for rank, n in enumerate(counts):
                got = ranks[rank][step]
                if n == 0:
                    assert got is None
                    continue
                x = _tokens(step, rank, n, hidden)
                for out, ref in zip(got, (moe(x), block(x))):
                    assert out.shape == ref.shape
                    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


CASES = {"v2-ep1": ("v2", 1), "v3-ep2": ("v3", 2)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, default_model_path) -> dict:
    return {
        name: save_hf(name, tmp_path_factory.mktemp(f"dp-{name}"), default_model_path)[:2]
        for name in ("v2", "v3")
    }


def _prompts() -> tuple[list[int], list[int], list[int]]:
    g = torch.Generator().manual_seed(21)
    draw = lambda n: torch.randint(3, 256, (n,), generator=g).tolist()
    doc = draw(40)
    return doc + draw(6), draw(20), doc + draw(9)


def _greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def _serve(e: Engine, a, b, c) -> dict:
    """A and B at once (A decodes 16 tokens, B 4: B's rank then idles), then C; their outputs, and
    the internal state after A and B and after C."""
    out = {
        "ab": [
            o["output_ids"]
            for o in e.generate(input_ids=[a, b], sampling_params=[_greedy(16), _greedy(4)])
        ]
    }
    out["state_ab"] = e.get_internal_state()
    c_out = e.generate(input_ids=c, sampling_params=_greedy(10))
    out["c"], out["c_cached"] = c_out["output_ids"], c_out["meta_info"]["cached_tokens"]
    out["state_c"] = e.get_internal_state()
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_dp_attention_matches_one_rank_and_transformers(case, checkpoints):
    name, ep = CASES[case]
    path, hf = checkpoints[name]
    a, b, c = _prompts()
    torch.set_num_threads(1)
    with torch.no_grad():
        refs = [
            hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0, len(p) :].tolist()
            for p, n in ((a, 16), (b, 4), (c, 10))
        ]
    with Engine(path, **engine_args()) as one:
        single = _serve(one, a, b, c)
    with Engine(
        path, **engine_args(tp_size=2, dp_size=2, enable_dp_attention=True, ep_size=ep)
    ) as e:
        assert e.scheduler_info["dp_size"] == 2
        got = _serve(e, a, b, c)
        if (
            name == "v2"
        ):  # a session's turns stay on the rank of its first turn (its KV is pinned there)
            sid = e.open_session(capacity_of_str_len=400)
            e.generate(input_ids=b + a, sampling_params=_greedy(3), session_params={"id": sid})
            second = e.generate(
                input_ids=[7, 8, 9], sampling_params=_greedy(3), session_params={"id": sid}
            )
            assert second["meta_info"]["cached_tokens"] >= len(a) + len(b)
            e.close_session(sid)
        # a weight update reaches every rank (each reloads its experts) and one answer comes back
        else:
            ok, message, _ = e.update_weights_from_disk(path)
            assert ok, message
            assert e.generate(input_ids=c, sampling_params=_greedy(10))["output_ids"] == refs[2]
        assert e.flush_cache()
        idle = e.get_internal_state()
    assert got["ab"] == single["ab"] == refs[:2]
    assert got["c"] == single["c"] == refs[2]
    ranks = got["state_ab"]["dp_ranks"]
    assert sorted(r["prompt_tokens"] for r in ranks) == sorted(
        [len(a), len(b)]
    )  # one request on each rank
    rank_a = next(k for k, r in enumerate(ranks) if r["prompt_tokens"] == len(a))
    assert (
        ranks[1 - rank_a]["dp_idle_forwards"] > 0
    )  # B's rank joined A's decode steps after B finished
    after = got["state_c"]["dp_ranks"]
    assert after[rank_a]["prompt_tokens"] == len(a) + len(
        c
    )  # C followed its prefix to A's rank ...
    assert got["c_cached"] >= 32  # ... and was served from that rank's radix cache
    assert got["state_c"]["dp_dispatch"]["cache_hits"] == 1
    assert got["state_c"]["prompt_tokens"] == len(a) + len(b) + len(c)  # the ranks' counts summed
    assert idle["num_running"] == idle["num_waiting"] == 0
    assert (
        idle["available_kv_tokens"]
        == idle["max_total_num_tokens"]
        == e.scheduler_info["max_total_num_tokens"]
    )
    for r in idle["dp_ranks"]:
        assert (
            r["available_kv_tokens"] == r["max_total_num_tokens"]
            and r["req_slots_free"] == r["req_slots_total"]
        )
