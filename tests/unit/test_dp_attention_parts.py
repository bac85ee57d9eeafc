"""DP attention's parts without processes: the dispatcher's choice of rank (cache affinity, load,
imbalance, namespaces, sessions, the other methods), rank 0's merging of the ranks' control answers,
and the option checks (SGLang's layout, what does not run with it yet, a dense model refused)."""

from __future__ import annotations

import pytest
from torch import nn

from radixlm.config import ServerArgs
from radixlm.distributed.communicator import SingleProcessCommunicator
from radixlm.distributed.config import DistConfig
from radixlm.ipc import (
    AbortReq,
    BindSessionReq,
    CloseSessionReq,
    ControlFailed,
    DashboardSnapshotReqOutput,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetInternalStateReqOutput,
    TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqOutput,
)
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.parallel.dp_attention import DPAttentionStep
from radixlm.scheduler.parallel.dp_dispatch import BLOCK, DPDispatcher, DPView
from radixlm.scheduler.parallel.dp_replies import ReplyMerger, merge_replies

_n = iter(range(10**6))


def req(ids: list[int], namespace=None) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        f"r{next(_n)}", None, ids, SamplingParams(), cache_namespace=namespace
    )


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


DOC = tokens(1000, 4 * BLOCK)


def test_cache_aware_spreads_new_prompts_and_follows_prefixes():
    view = DPView(2)
    d = DPDispatcher(view)
    assert d.assign(req(DOC + [1, 2])) == 0  # both idle: the lower rank
    assert d.assign(req(tokens(5000, 3 * BLOCK))) == 1  # unrelated: the less loaded rank
    assert d.assign(req(DOC + [3, 4, 5])) == 0  # most of it was sent to rank 0
    # half the prompt or less cached: load decides (rank 0 holds 2 requests, rank 1 one)
    assert d.assign(req(DOC[:BLOCK] + tokens(9000, 2 * BLOCK))) == 1
    assert d.info() == {"method": "auto", "requests": [2, 2], "cache_hits": 1}
    # the view counts what the ranks hold after a step; requests sent since are added to it
    view.requests = [0, 5]
    d.step_seen()
    assert d.loads() == [0, 5]
    assert d.assign(req(tokens(7000, 40))) == 0


def test_imbalance_beats_the_cache_and_namespaces_do_not_share():
    view = DPView(2, requests=[40, 2])
    d = DPDispatcher(view)
    other = tokens(3000, 3 * BLOCK)
    for prompt in (DOC, other):
        d.index.insert(0, d.index.chain(prompt, (None, None)))
    assert d.assign(req(DOC)) == 1  # 40 against 2: the least loaded rank, whatever it caches
    view.requests = [3, 2]
    d.step_seen()
    assert d.assign(req(other)) == 0  # balanced again: the prefix wins over the lighter load
    ns = DPDispatcher(DPView(2, requests=[1, 0]))
    ns.index.insert(0, ns.index.chain(DOC, (None, None)))
    assert ns.assign(req(DOC, namespace="tenant-b")) == 1  # another namespace's KV is not shared
    assert ns.assign(req(DOC)) == 0


def test_round_robin_total_tokens_and_sessions():
    rr = DPDispatcher(DPView(3), "round_robin")
    assert [rr.assign(req(DOC)) for _ in range(4)] == [0, 1, 2, 0]
    view = DPView(2, requests=[1, 5], tokens=[900, 100])
    assert DPDispatcher(view, "total_requests").assign(req(DOC)) == 0
    assert DPDispatcher(view, "total_tokens").assign(req(DOC)) == 1
    d = DPDispatcher(DPView(2))
    assert d.assign(BindSessionReq("t1", "s")) is None  # every rank hears of the binding
    first = req(tokens(1, 10))
    first = TokenizedGenerateReqInput("t1", None, first.input_ids, SamplingParams())
    assert d.assign(first) == 0
    d.view.requests = [9, 0]
    d.step_seen()
    d.assign(BindSessionReq("t2", "s"))
    assert (
        d.assign(TokenizedGenerateReqInput("t2", None, [5], SamplingParams())) == 0
    )  # the session's rank
    assert d.assign(CloseSessionReq("s")) is None and "s" not in d.sessions
    assert d.assign(AbortReq("t2")) is None and d.assign(FlushCacheReq()) is None
    with pytest.raises(ValueError, match="load_balance_method must be one of"):
        DPDispatcher(DPView(2), "follow_bootstrap_room")


def test_prefix_index_is_bounded():
    d = DPDispatcher(DPView(1), capacity_tokens=4 * BLOCK)
    d.index.insert(0, d.index.chain(tokens(0, 10 * BLOCK), None))
    assert len(d.index.seen[0]) == 4


def test_answers_merge_when_every_rank_answered_in_order():
    sent = []
    m = ReplyMerger(2, sent.append)
    m.add(0, FlushCacheReqOutput(True))
    m.add(0, FlushCacheReqOutput(False, "requests are running"))
    m.add(1, GetInternalStateReqOutput({"num_running": 1}))
    assert sent == [] and m.waiting() == 3
    m.add(1, FlushCacheReqOutput(True))
    assert sent == [FlushCacheReqOutput(True)]
    m.add(1, FlushCacheReqOutput(True))
    assert sent[-1] == FlushCacheReqOutput(False, "dp rank 0: requests are running")
    m.add(0, ControlFailed(GetInternalStateReqOutput))
    assert sent[-1] == ControlFailed(GetInternalStateReqOutput) and m.waiting() == 0


def test_merged_values():
    out = merge_replies(
        [UpdateWeightFromDiskReqOutput(True, "ok", 2), UpdateWeightFromDiskReqOutput(True, "ok", 3)]
    )
    assert out == UpdateWeightFromDiskReqOutput(True, "ok", 5)
    states = [
        {
            "prompt_tokens": 10,
            "cached_tokens": 10,
            "cache_hit_rate": 1.0,
            "decode_outside_share": 0.2,
            "expert_load": {"1": [1, 0, 2]},
            "dp_rank": 0,
            "hicache": {"l2_loads": 1},
            "architecture": "X",
        },
        {
            "prompt_tokens": 30,
            "cached_tokens": 0,
            "cache_hit_rate": 0.0,
            "decode_outside_share": 0.4,
            "expert_load": {"1": [0, 5, 1]},
            "dp_rank": 1,
            "hicache": {"l2_loads": 2},
            "architecture": "X",
        },
    ]
    merged = merge_replies([GetInternalStateReqOutput(s) for s in states]).state
    assert merged["prompt_tokens"] == 40 and merged["cache_hit_rate"] == 0.25
    assert merged["decode_outside_share"] == pytest.approx(0.3)
    assert merged["expert_load"] == {"1": [1, 5, 3]} and merged["hicache"] == {"l2_loads": 3}
    assert (
        merged["architecture"] == "X" and "dp_rank" not in merged and merged["dp_ranks"] == states
    )
    trees = [[{"id": 1, "parent": None}, {"id": 2, "parent": 1}], [{"id": 1, "parent": None}]]
    snap = merge_replies([DashboardSnapshotReqOutput(s, t) for s, t in zip(states, trees)])
    ids = [n["id"] for n in snap.tree]
    assert len(set(ids)) == 3 and snap.tree[1]["parent"] == ids[0] and snap.tree[2]["dp_rank"] == 1


def test_option_checks():
    with pytest.raises(ValueError, match="tp_size 1 must be a multiple of dp_size 2"):
        DistConfig(tp_size=1, dp_size=2, enable_dp_attention=True)
    with pytest.raises(ValueError, match="use --tp-size 2"):
        DistConfig(tp_size=4, dp_size=2, enable_dp_attention=True)
    with pytest.raises(ValueError, match="pp_size 1"):
        DistConfig(tp_size=2, dp_size=2, enable_dp_attention=True, pp_size=2)
    ok = DistConfig(tp_size=2, dp_size=2, enable_dp_attention=True, ep_size=2)
    assert ok.attn_tp_size == 1 and ok.world_size == 2
    assert not ServerArgs(dp_size=1, enable_dp_attention=True).enable_dp_attention  # SGLang's rule
    with pytest.raises(
        ValueError, match="enable_dp_attention: DP attention needs --tp-size equal to --dp-size"
    ):
        ServerArgs(tp_size=4, dp_size=2, enable_dp_attention=True)
    from radixlm.engine.launcher import check_server_args

    base = dict(tp_size=2, dp_size=2, enable_dp_attention=True)
    for extra, name in (
        (dict(speculative_algorithm="ngram"), "speculative_algorithm"),
        (dict(enable_overlap_schedule=True), "enable_overlap_schedule"),
        (dict(enable_torch_compile=True), "enable_torch_compile"),
    ):
        with pytest.raises(ValueError, match=f"{name} is not supported with enable_dp_attention"):
            check_server_args(ServerArgs(**base, **extra))
    with pytest.raises(ValueError, match="load_balance_method must be one of"):
        check_server_args(ServerArgs(**base, load_balance_method="nearest"))


def test_a_dense_model_is_refused():
    step = DPAttentionStep(SingleProcessCommunicator(), DPView(1), None)
    with pytest.raises(ValueError, match="enable_dp_attention needs a mixture-of-experts model"):
        step.attach(nn.Linear(2, 2), lambda: (0, 0, 0), 100)


def test_the_command_line_refuses_unequal_sizes_in_one_line(capsys):
    from radixlm.cli import main

    assert main(["serve", "--model-path", "m", "--enable-dp-attention", "--dp-size", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "radixlm: error: --enable-dp-attention: DP attention needs --tp-size equal to --dp-size"
        " (one rank per attention group; radixlm does not split a group's heads over ranks) ;"
        " --tp-size N --dp-size N (N >= 2) on a MoE model"
    ]
