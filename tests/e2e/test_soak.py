"""The soak (radixlm/bench/soak/, docs/reliability.md "Soak") on the tiny model: 200 mixed requests
(native and OpenAI, chat and completions, streaming and not, n > 1, JSON schema, regex, logprobs,
long and short prompts sharing prefixes), ~20% of clients disconnecting at random moments, against a
KV pool ~10x too small for the offered load, with the scheduler's invariant checks on. Every check
must pass: no 5xx or other unexpected status, no hang, valid outputs, the server alive, nothing
leaked, and greedy outputs equal to a quiet replay's."""

import time

import pytest

from radixlm.bench.soak.config import SoakConfig
from radixlm.bench.soak.hostile import HostileConfig, HostileLoad
from radixlm.bench.soak.report import format_summary
from radixlm.bench.soak.runner import run

# The largest request (a 600-word prompt + 32 new tokens, ~700 tokens) must fit the pool alone.
POOL = 750
# Greedy replays must equal the loaded run's outputs, which holds on the batch-invariant path only:
# quantized weights run the native GEMM (the same sums whatever the batch); float32 weights run
# MKL's GEMM, whose sums change with the batch shape, so a near-tie can flip under load
# (docs/reliability.md "Soak").
INVARIANT = ["--quantization", "q8_0"]


def _assert_soaked(s: dict, cfg: SoakConfig, report: str) -> None:
    assert s["ok"], report
    # The workload is what the soak claims: overloaded pool, every kind, disconnects, a replay.
    assert 7 <= s["offered_load_ratio"] <= 15, report
    kinds = {
        f"{api}/{mode}" for api in ("native", "completions", "chat") for mode in ("plain", "stream")
    }
    assert set(s["by_kind_status"]) == kinds, report
    for f in ("n>1", "json", "regex", "logprobs", "long", "short", "greedy", "sampled"):
        assert s["features"].get(f, 0) >= 10, (f, report)
    assert 0.1 * cfg.num_requests <= s["disconnects"] <= 0.3 * cfg.num_requests, report
    assert len(s["disconnect_phases"]) >= 2, report  # before the answer and mid-stream
    assert s["greedy_replayed"] >= 50 and s["greedy_mismatches"] == 0, report
    # Alive until stopped; then SIGTERM's clean exit (128 + 15), not an engine failure's code.
    assert s["server_alive_at_end"] and s["server_exit_code"] in (0, 143), report


def test_soak_tiny(tiny_model_dir):
    cfg = SoakConfig(
        num_requests=200,
        concurrency=48,
        seed=1,
        disconnect_rate=0.2,
        request_timeout=120.0,
        max_new_tokens=(4, 32),
        short_words=(3, 30),
        long_words=(200, 600),
        drain_timeout=30.0,
    )
    server_args = [
        "--model-path",
        tiny_model_dir,
        "--num-threads",
        "1",
        "--max-total-tokens",
        str(POOL),
        "--enable-invariant-checks",
        *INVARIANT,
    ]
    s = run(None, cfg, server_args, log=lambda *a: None)
    s.pop("_results")
    report = format_summary(s)
    print(report)  # pytest -s shows the figures
    _assert_soaked(s, cfg, report)


def test_soak_checks_catch_failures():
    """The checks themselves: a leak, a server abort, a broken schema, a greedy mismatch are
    caught."""
    from radixlm.bench.soak.checks import leak_state, output_problems
    from radixlm.bench.soak.client import SoakResult
    from radixlm.bench.soak.workload import SCHEMAS, build_workload

    state = dict(
        max_total_num_tokens=100,
        available_kv_tokens=60,
        evictable_tokens=40,
        protected_tokens=0,
        req_slots_total=8,
        req_slots_free=8,
        num_running=0,
        num_waiting=0,
    )
    assert leak_state({"num_tracked_requests": 0, "internal_state": state}) == []
    assert leak_state({"num_tracked_requests": 1, "internal_state": state})
    for k, v in dict(
        available_kv_tokens=59, req_slots_free=7, protected_tokens=3, num_waiting=1
    ).items():
        assert leak_state({"num_tracked_requests": 0, "internal_state": {**state, k: v}}), k

    req = next(
        q
        for q in build_workload(SoakConfig(num_requests=300))
        if q.constraint == "json" and q.n == 1
    )
    req.constraint_value, req.greedy = SCHEMAS[0], True
    ok = {
        "text": '{"name": "Ann", "age": 30}',
        "ids": None,
        "finish": "stop",
        "lp": None,
        "top": None,
    }
    res = SoakResult(req.idx, req.kind, status=200, choices={0: ok})
    req.logprobs = False
    assert output_problems(req, res) == []
    bad = SoakResult(req.idx, req.kind, status=200, choices={0: {**ok, "text": '{"name": "Ann"}'}})
    assert "breaks the schema" in output_problems(req, bad)[0]
    aborted = SoakResult(req.idx, req.kind, status=200, choices={0: {**ok, "finish": "abort"}})
    assert "finished 'abort'" in output_problems(req, aborted)[0]
    req.n = 2
    differ = SoakResult(
        req.idx,
        req.kind,
        status=200,
        choices={0: ok, 1: {**ok, "text": '{"name": "Bo", "age": 3}'}},
    )
    assert output_problems(req, differ) == ["greedy choices differ"]


def _hostile(tiny_model_dir, tmp_path, cfg: SoakConfig, interval: float) -> tuple[dict, str]:
    """The soak with attackers alongside, against a server with a disk (L3) cache whose files they
    forge."""
    store = tmp_path / "l3"
    server_args = [
        "--model-path",
        tiny_model_dir,
        "--num-threads",
        "1",
        "--max-total-tokens",
        str(POOL),
        "--enable-invariant-checks",
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
        str(store),
        "--hicache-dtype",
        "float32",
        "--hicache-storage-chunk-size",
        "16",
        *INVARIANT,
    ]
    side = HostileLoad(HostileConfig(interval=interval, forge_dir=str(store), seed=cfg.seed))
    s = run(None, cfg, server_args, log=lambda *a: None, side=[side])
    s.pop("_results")
    return s, format_summary(s)


def test_hostile_soak_tiny(tiny_model_dir, tmp_path):
    """A short hostile load: a ReDoS stop_regex forced by logit_bias, batch x n fan-out, an
    oversized /tokenize, a client's Jinja template bomb, slow-loris connections and forged
    disk-cache files, mixed into the normal soak: /health answers within 2 s every time, every
    attack is refused (or, the ReDoS, stopped), and the normal requests pass every soak check (no
    5xx, outputs, no leaks, invariants, greedy replay)."""
    cfg = SoakConfig(
        num_requests=160,
        concurrency=40,
        seed=3,
        disconnect_rate=0.2,
        request_timeout=120.0,
        max_new_tokens=(4, 24),
        short_words=(3, 30),
        long_words=(200, 600),
        drain_timeout=30.0,
    )
    s, report = _hostile(tiny_model_dir, tmp_path, cfg, interval=1.0)
    print(report)
    _assert_soaked(s, cfg, report)  # the plain soak's checks of its workload too
    h = s["hostile"]
    assert h["health_probes"] >= 10 and h["health_max_s"] <= 2.0, report
    assert all(sum(v.values()) >= 2 for v in h["attacks"].values()), report
    assert sum(h["forged"].values()) >= 3, report


@pytest.mark.soak
@pytest.mark.timeout(3 * 3600)
def test_hostile_soak_30_minutes(tiny_model_dir, tmp_path):
    """The long hostile load (pytest -m soak): about 30 minutes on this 2-core machine."""
    cfg = SoakConfig(
        num_requests=15000,
        concurrency=32,
        seed=4,
        disconnect_rate=0.15,
        request_timeout=300.0,
        max_new_tokens=(4, 32),
        short_words=(3, 30),
        long_words=(200, 600),
        drain_timeout=60.0,
    )
    t0 = time.monotonic()
    s, report = _hostile(tiny_model_dir, tmp_path, cfg, interval=3.0)
    print(f"{time.monotonic() - t0:.0f} s\n{report}")
    assert s["ok"], report
    assert all(sum(v.values()) >= 100 for v in s["hostile"]["attacks"].values()), report
