"""The fleet soak (radixlm/bench/soak/fleet.py, chaos.py; docs/reliability.md "Fleet under chaos"):
the hostile soak through SGLang's gateway (sglang-router) over two radixlm workers sharing a
Mooncake master, with one worker's scheduler frozen and the master killed mid-run.

test_chaos_checks_catch_failures runs the chaos checks on made-up probes, a crash dump and request
results (no server, well under a second): each way the run could go wrong fails its check.
test_fleet_hostile_soak is the run itself (pytest -m soak): three servers start, the watchdog
waits its timeout and the frozen worker restarts, ~2 minutes here, so it is not in the suite."""

from __future__ import annotations

import json
import os
import time

import pytest

from radixlm.bench.soak.chaos import HEALTH_SLACK, ChaosConfig, ChaosLoad
from radixlm.bench.soak.client import SoakResult
from tests.mooncake import requires_mooncake

PID = 4242
HUNG = f"the scheduler process (pid {PID}) hung: no loop iteration for 10.1 s; killed"
T0 = 1_000_000.0  # the load starts; the freeze at +20 s, the master killed at +40 s


def _chaos(tmp_path, unfinished: int = 3) -> ChaosLoad:
    folder = tmp_path / "dumps"
    (folder / "host").mkdir(parents=True)
    requests = [{"finished": False, "created_time": T0 + 15 + i} for i in range(unfinished)] + [
        {"finished": True, "created_time": T0 + 1}
    ]
    dump = {"reason": HUNG, "requests": requests}
    (folder / "host" / "crash_dump_2026-01-01_00-00-00.json").write_text(json.dumps(dump))
    cfg = ChaosConfig(["http://a", "http://b"], str(folder), watchdog_timeout=10.0, restart=True)
    c = ChaosLoad(cfg, kill_master=lambda: None)
    c.t_load, c.t_freeze, c.t_kill, c.frozen_pid = T0, T0 + 20, T0 + 40, PID
    # Probes every 0.5 s for 60 s: (sent, received, status). Worker a: always 200; worker b: 200
    # until 10.6 s after the freeze, 503 while its engine restarts, 200 from +45 s on.
    times = [T0 + 0.5 * i for i in range(120)]
    c.probes[0] = [(t, t + 0.01, 200) for t in times]
    c.probes[1] = [(t, t + 0.01, 503 if T0 + 30.6 <= t < T0 + 45 else 200) for t in times]
    return c


def _results(*rows: tuple) -> dict[int, SoakResult]:
    out = {}
    for i, (status, error) in enumerate(rows):
        r = SoakResult(i, "native/stream", status=status, error=error, started=T0 + 19)
        r.disconnected = status == "disconnected"
        out[i] = r
    return out


def test_chaos_checks_catch_failures(tmp_path):
    c = _chaos(tmp_path)
    results = _results((200, None), ("disconnected", None), (503, HUNG), (503, HUNG))
    assert c.excused([], results) == {2, 3}
    s = c.summary()
    assert all(s["checks"].values()), s
    assert s["in_flight_on_frozen"] == 3 and s["lost"] == 2
    # the first request waited from the freeze (+20 s); the first 503 was the probe sent at +31 s
    assert s["frozen_health_503_after_s"] == pytest.approx(11.01)
    assert s["frozen_back_after_503_s"] == pytest.approx(14.0)  # 200 again at +45 s

    def failed(c: ChaosLoad, results=None) -> set[str]:
        c.excused([], results or {})
        return {k for k, v in c.summary()["checks"].items() if not v}

    # more lost than in flight on the frozen worker
    many = _results(*[(503, HUNG)] * 4)
    assert failed(_chaos(tmp_path / "1"), many) == {"lost_within_in_flight"}
    # a request lost to something else than the frozen worker's watchdog (the gateway's 503)
    other = _results((503, "No available workers (all circuits open or unhealthy)"))
    c = _chaos(tmp_path / "2")
    assert failed(c, other) == {"lost_within_in_flight"}
    assert c.excused([], other) == set()  # the status check counts it
    # no crash dump: nothing says what was in flight
    c = _chaos(tmp_path / "3")
    os.remove(next((tmp_path / "3" / "dumps" / "host").iterdir()))
    assert failed(c, _results((503, HUNG))) == {"lost_within_in_flight"}
    # the frozen worker's /health: 503 too late, 503 before the freeze, never back, 503 again
    c = _chaos(tmp_path / "4")
    c.probes[1] = [
        (t, r, 200 if t < T0 + 20 + 10 + HEALTH_SLACK + 0.5 else 503) for t, r, _ in c.probes[1]
    ]
    assert failed(c) == {"frozen_health_503", "frozen_health_back"}
    c = _chaos(tmp_path / "5")
    c.probes[1][3] = (c.probes[1][3][0], c.probes[1][3][1], 503)
    assert failed(c) == {"frozen_health_503"}
    c = _chaos(tmp_path / "6")
    c.probes[1][-1] = (c.probes[1][-1][0], c.probes[1][-1][1], "ReadTimeout")
    assert failed(c) == {"frozen_health_back"}
    # the other worker not 200 once, or never probed while the master was dead
    c = _chaos(tmp_path / "7")
    c.probes[0][100] = (c.probes[0][100][0], c.probes[0][100][1], 503)
    assert failed(c) == {"other_health_200"}
    c = _chaos(tmp_path / "8")
    c.probes[0] = [p for p in c.probes[0] if p[0] < T0 + 40]
    assert failed(c) == {"other_health_200"}
    # the chaos never came (the load ended first)
    c = _chaos(tmp_path / "9")
    c.t_kill = None
    assert "chaos_done" in failed(c)


@requires_mooncake
@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_fleet_hostile_soak(tiny_model_dir):
    from radixlm.bench.soak.config import SoakConfig
    from radixlm.bench.soak.fleet import FleetConfig, run_fleet
    from radixlm.bench.soak.hostile import HostileConfig
    from radixlm.bench.soak.report import format_summary

    cfg = SoakConfig(
        num_requests=300,
        concurrency=16,
        seed=3,
        disconnect_rate=0.1,
        request_timeout=120.0,
        max_new_tokens=(4, 24),
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
        "750",
        "--enable-invariant-checks",
        "--hicache-dtype",
        "float32",
        "--hicache-storage-chunk-size",
        "16",
        "--quantization",  # the batch-invariant path: greedy replays equal (test_soak.py)
        "q8_0",
    ]
    fleet = FleetConfig(server_args, freeze_at=10.0, kill_master_at=20.0)
    t0 = time.monotonic()
    s = run_fleet(cfg, fleet, HostileConfig(interval=1.0, seed=3), log=lambda *a: None)
    s.pop("_results")
    report = format_summary(s)
    print(f"{time.monotonic() - t0:.0f} s\n{report}")
    assert s["ok"], report
    ch = s["chaos"]
    assert ch["in_flight_on_frozen"] >= 1 and ch["lost"] <= ch["in_flight_on_frozen"], report
    assert ch["frozen_health_503_after_s"] <= fleet.watchdog_timeout + HEALTH_SLACK, report
    assert ch["probes"]["other_while_master_dead"] >= 4, report
    assert s["greedy_replayed"] >= 50 and s["greedy_mismatches"] == 0, report
