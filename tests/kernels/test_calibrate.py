"""The kernel levels are chosen by timing each on the machine (kernels/calibrate.py): the choice
is one of the levels the CPU runs, stored once and read back, set per use (one activation row,
more rows, the delta rule), overridden by RADIXLM_KERNEL_ISA; and `radixlm bench limits` measures
the machine's read rate and compute peaks with the native loops (kernels/csrc/peaks.cpp)."""

import json
import os
import time

import pytest
import torch

from radixlm.kernels import calibrate


@pytest.fixture
def levels_kept(kernel_ops):
    saved_q, saved_la = kernel_ops.qlinear_levels(), kernel_ops.linear_attn_isa()
    yield
    kernel_ops.qlinear_levels(*saved_q)
    kernel_ops.linear_attn_isa(saved_la)


@pytest.fixture
def calibration_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(calibrate.ISA_ENV, raising=False)
    monkeypatch.delenv(calibrate.CALIBRATE_ENV, raising=False)
    return str(tmp_path)


def test_decode_and_batch_levels_are_set_apart(kernel_ops, levels_kept):
    isas = kernel_ops.qlinear_isas()
    assert isas[0] == "avx2" and isas == ["avx2", "avx512vnni", "avx512vbmi", "amx"][: len(isas)]
    assert kernel_ops.qlinear_levels("avx2", isas[-1]) == ["avx2", isas[-1]]
    assert kernel_ops.qlinear_levels("", "avx2") == ["avx2", "avx2"]
    # AMX is a level for more than one row: asked for one row, it runs (and says) VBMI's kernels
    one_row = "avx512vbmi" if isas[-1] == "amx" else isas[-1]
    assert kernel_ops.qlinear_levels(isas[-1], "") == [one_row, "avx2"]
    # qlinear_isa sets both and answers the batch level.
    assert kernel_ops.qlinear_isa("avx2") == "avx2"
    assert kernel_ops.qlinear_levels() == ["avx2", "avx2"]
    with pytest.raises(RuntimeError, match="qlinear_levels: isa must be"):
        kernel_ops.qlinear_levels("sse2", "")


def test_the_faster_level_is_kept_whatever_its_width():
    """A wider level measured slower is not chosen (Zen 4's VBMI level against VNNI's)."""
    cost = {"avx2": 0.004, "avx512vnni": 0.001, "avx512vbmi": 0.003}
    state = {}
    timings = calibrate._fastest(
        list(cost), lambda lv: state.update(lv=lv), lambda: time.sleep(cost[state["lv"]]), rounds=2
    )
    assert set(timings) == set(cost) and all(t >= cost[lv] * 1e6 for lv, t in timings.items())
    assert calibrate._pick(timings) == "avx512vnni"


def test_levels_within_the_tie_keep_the_wider():
    """Within TIE of each other the wider level stays (a model's streaming step favours it where
    ~30 MB of cached weights cannot tell them apart); past it the faster one wins."""
    tie, pick = calibrate.TIE, calibrate._pick
    assert pick({"avx2": 100.0, "avx512vnni": 100.0, "avx512vbmi": 100.0}) == "avx512vbmi"
    near, far = 100.0 * (1 - tie / 2), 100.0 * (1 - 2 * tie)
    assert pick({"avx2": 130.0, "avx512vnni": near, "avx512vbmi": 100.0}) == "avx512vbmi"
    assert pick({"avx2": 130.0, "avx512vnni": far, "avx512vbmi": 100.0}) == "avx512vnni"
    # each narrower level must beat the one kept so far, not only the widest
    just_faster = far * (1 - tie / 2)
    assert pick({"avx2": just_faster, "avx512vnni": far, "avx512vbmi": 100.0}) == "avx512vnni"
    assert pick({"avx2": 1.0, "avx512": 1.0}) == "avx512"


def test_a_stored_calibration_is_chosen_again_by_the_current_rule(calibration_dir):
    """A file written under an older rule (the fastest by any margin) is read with today's."""
    timings = {
        "decode": {"avx2": 2075.0, "avx512vnni": 1911.0, "avx512vbmi": 1912.0},
        "batch": {"avx2": 22626.0, "avx512vnni": 17240.0, "avx512vbmi": 11026.0},
        "linear_attn": {"avx2": 2057.0, "avx512": 926.0},
    }
    entry = {
        "decode": "avx512vnni",
        "batch": "avx512vbmi",
        "linear_attn": "avx512",
        "threads": torch.get_num_threads(),
        "cpu": calibrate.cpu_name(),
        "timings": timings,
    }
    with open(os.path.join(calibration_dir, calibrate.FILE), "w") as f:
        json.dump({calibrate._key(): entry}, f)
    cal = calibrate.cached(calibration_dir)
    assert (cal.decode, cal.batch, cal.linear_attn) == ("avx512vbmi", "avx512vbmi", "avx512")


def test_calibration_measures_every_level_stores_and_applies_it(
    kernel_ops, levels_kept, calibration_dir, monkeypatch
):
    cal = calibrate.calibrate(calibration_dir)
    isas = kernel_ops.qlinear_isas()
    assert cal.decode in isas and cal.batch in isas
    assert cal.linear_attn in calibrate.linear_attn_levels()
    assert cal.threads == torch.get_num_threads() and cal.cpu == calibrate.cpu_name()
    assert set(cal.timings["decode"]) == set(isas) - {"amx"}
    for use in ("batch_8", "batch_64", "batch_256", "batch"):
        assert set(cal.timings[use]) == set(isas)
        assert all(0 < us < float("inf") for us in cal.timings[use].values())
    assert cal.decode == calibrate._pick(cal.timings["decode"])
    assert cal.batch == calibrate._pick(cal.timings["batch"])
    # Measuring left the levels as they were; the stored one is read back without measuring.
    kernel_ops.qlinear_levels("avx2", "avx2")
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured again"))
    assert calibrate.calibrate(calibration_dir) == cal
    assert calibrate.ensure(calibration_dir) == cal
    assert kernel_ops.qlinear_levels() == [cal.decode, cal.batch]
    assert kernel_ops.linear_attn_isa() == cal.linear_attn


def test_forced_isa_and_calibrate_env(kernel_ops, levels_kept, calibration_dir, monkeypatch):
    kernel_ops.qlinear_levels("avx2", "avx2")
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured"))
    monkeypatch.setenv(calibrate.ISA_ENV, "avx2")
    assert calibrate.ensure(calibration_dir) is None  # forced: nothing measured, nothing changed
    monkeypatch.delenv(calibrate.ISA_ENV)
    monkeypatch.setenv(calibrate.CALIBRATE_ENV, "0")
    assert calibrate.ensure(calibration_dir) is None
    assert kernel_ops.qlinear_levels() == ["avx2", "avx2"]
    # =1 measures again even with a stored calibration.
    stored = calibrate.Calibration("avx2", "avx2", "avx2", 1, "x", {})
    monkeypatch.setattr(calibrate, "cached", lambda directory: stored)
    fresh = calibrate.Calibration("avx2", "avx2", "avx2", 2, "y", {"decode": {"avx2": 1.0}})
    monkeypatch.setattr(calibrate, "measure", lambda: fresh)
    monkeypatch.setenv(calibrate.CALIBRATE_ENV, "1")
    assert calibrate.ensure(calibration_dir) == fresh


def test_a_calibration_failure_keeps_the_levels(
    kernel_ops, levels_kept, calibration_dir, monkeypatch
):
    before = kernel_ops.qlinear_levels()

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(calibrate, "measure", broken)
    monkeypatch.setattr(calibrate, "busy", lambda: None)  # (a quiet machine: it measures)
    assert calibrate.ensure(calibration_dir) is None
    assert kernel_ops.qlinear_levels() == before


def test_a_busy_machine_is_not_timed_and_nothing_is_stored(
    kernel_ops, levels_kept, calibration_dir, monkeypatch
):
    """Timings taken beside other work would pick wrong levels and be kept: a machine busier than
    its CPUs keeps the flags' levels until a quieter start; a stored calibration still applies,
    and RADIXLM_KERNEL_CALIBRATE=1 measures anyway."""
    kernel_ops.qlinear_levels("avx2", "avx2")
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured on a busy machine"))
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (cpus + 1.5, 0.0, 0.0))
    assert calibrate.busy() == f"the machine is busy (load {cpus + 1.5:.1f} on {cpus} CPUs)"
    assert calibrate.ensure(calibration_dir) is None
    assert kernel_ops.qlinear_levels() == ["avx2", "avx2"]
    assert not os.path.exists(os.path.join(calibration_dir, calibrate.FILE))
    stored = calibrate.Calibration("avx2", "avx2", "avx2", 1, "x", {})
    monkeypatch.setattr(calibrate, "cached", lambda directory: stored)
    assert calibrate.ensure(calibration_dir) == stored
    fresh = calibrate.Calibration("avx2", "avx2", "avx2", 2, "y", {"decode": {"avx2": 1.0}})
    monkeypatch.setattr(calibrate, "measure", lambda: fresh)
    monkeypatch.setenv(calibrate.CALIBRATE_ENV, "1")
    assert calibrate.ensure(calibration_dir) == fresh
    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (cpus - 0.5, 0.0, 0.0))
    assert calibrate.busy() is None


def test_compute_peaks(kernel_ops):
    from radixlm.bench.limits import PEAK_KINDS, cpu_flags

    flags = cpu_flags()
    for kind, flag, _ in PEAK_KINDS:
        if flag in flags:
            rate = kernel_ops.compute_peak(kind, 20_000)
            # ops per second: at least one multiply-add per cycle of a 100 MHz core
            assert 1e8 < rate < 1e15, kind
        else:
            with pytest.raises(RuntimeError, match="this CPU has no"):
                kernel_ops.compute_peak(kind, 20_000)
    with pytest.raises(RuntimeError, match="kind must be"):
        kernel_ops.compute_peak("int4_amx", 10)
    with pytest.raises(RuntimeError, match="iters must be positive"):
        kernel_ops.compute_peak("int8_avx2", 0)


def test_bench_limits_command(kernel_ops, levels_kept, calibration_dir, tmp_path, capsys):
    import argparse
    import json

    from radixlm.bench import limits

    p = argparse.ArgumentParser()
    limits.add_args(p)
    out = tmp_path / "limits.json"
    args = p.parse_args(["--read-mib", "64", "--output-file", str(out)])
    assert limits.main(args) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    lim = data["limits"]
    assert lim["read_bytes"] == 64 * 2**20 and lim["read_gbps"] > 0
    assert "int8_avx2" in lim["peaks"] and "fp32_avx2" in lim["peaks"]
    assert f"read a fresh 64 MiB buffer: {lim['read_gbps']:.1f} GB/s" in text
    assert data["calibration"]["decode"] in kernel_ops.qlinear_isas()
    assert "kernel levels (calibrated for" in text
