"""`radixlm bench limits`: this machine's limits, with the threads a server uses: the read rate of
a fresh buffer larger than the last-level cache (what a decode step's weights stream at), the peak
rate of the integer dot product and of float32 FMA at each ISA level the CPU has (native loops of
independent multiply-add chains: kernels/csrc/peaks.cpp), and what the kernel calibration measured
for each kernel level (kernels/calibrate.py; --recalibrate measures again and stores it).
`bench one-batch` reports its steps against the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

# (kind, the CPU flag it needs, what it is)
PEAK_KINDS = (
    ("int8_avx2", "avx2", "int8 dot, AVX2 (vpmaddubsw + vpmaddwd)"),
    ("int8_avxvnni", "avx_vnni", "int8 dot, AVX-VNNI (vpdpbusd ymm)"),
    ("int8_avx512vnni", "avx512_vnni", "int8 dot, AVX-512 VNNI (vpdpbusd zmm)"),
    ("int8_amx", "amx_int8", "int8 dot, AMX (tdpbssd tiles)"),
    ("fp32_avx2", "fma", "fp32 FMA, 256-bit"),
    ("fp32_avx512", "avx512f", "fp32 FMA, 512-bit"),
)


@dataclass
class Limits:
    cpu: str
    threads: int
    llc_bytes: int
    read_bytes: int
    read_gbps: float  # median of the passes over a fresh buffer
    read_gbps_best: float
    peaks: dict[str, float] = field(default_factory=dict)  # kind -> operations per second
    amx: str = "absent"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None, help="default: torch's thread count")
    p.add_argument(
        "--read-mib",
        type=int,
        default=None,
        help="the read buffer (default: twice the last-level cache, at least 512 MiB)",
    )
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="time the kernel levels again and store the choice (kernels/calibrate.py)",
    )
    p.add_argument("--output-file", default=None, help="write the figures as JSON")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def llc_bytes() -> int:
    """The last-level cache, bytes (kernels/calibrate.py's, imported late: torch comes with it)."""
    from radixlm.kernels.calibrate import llc_bytes as last_level

    return last_level()


def read_rate(nbytes: int, repeats: int = 7) -> tuple[float, float]:
    """(median, best) GB/s of passes over a freshly allocated buffer of nbytes: a float32 sum of
    ones (no assists), as `bench one-batch` and benchmarks/read_rate.py read. (An int64 max over
    the same 520 MiB read 15 GB/s against the sum's 28 on an Intel Xeon: its reduction, not
    memory, bounds it.)"""
    import torch

    buf = torch.ones(nbytes // 4)  # touched: its pages exist
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - t0)
    times = times[1:]
    return nbytes / statistics.median(times) / 1e9, nbytes / min(times) / 1e9


def peak(kind: str, seconds: float = 0.15, repeats: int = 3) -> float:
    """Operations per second of one kind of multiply-add loop on every thread (best of repeats),
    its iteration count sized to run about `seconds`."""
    from radixlm.kernels.ops import ops

    t0 = time.perf_counter()
    ops().compute_peak(kind, 20_000)  # sizes the loop (and warms the clocks)
    iters = max(20_000, int(20_000 * seconds / (time.perf_counter() - t0)))
    return max(ops().compute_peak(kind, iters) for _ in range(repeats))


def peaks(prefix: str = "") -> dict[str, float]:
    """Operations per second of every loop kind the CPU has whose name starts with `prefix`
    ("int8", "fp32" or all)."""
    flags = cpu_flags()
    out = {}
    for k, flag, _ in PEAK_KINDS:
        if not k.startswith(prefix) or flag not in flags:
            continue
        try:
            out[k] = peak(k)
        except RuntimeError:  # AMX flagged but its tile state refused by the OS
            continue
    return out


def measure(threads: int | None = None, read_mib: int | None = None) -> Limits:
    import torch

    from radixlm.kernels.calibrate import cpu_name

    if threads:
        torch.set_num_threads(threads)
    llc = llc_bytes()
    nbytes = (read_mib * 2**20) if read_mib else max(2 * llc, 512 * 2**20)
    med, best = read_rate(nbytes)
    amx = "absent"
    if {"amx_tile", "amx_int8"} <= cpu_flags():
        amx = "present: the int8 tiles' peak above; the prefill tiles' level `amx`"
    return Limits(
        cpu=cpu_name(),
        threads=torch.get_num_threads(),
        llc_bytes=llc,
        read_bytes=nbytes,
        read_gbps=med,
        read_gbps_best=best,
        peaks=peaks(),
        amx=amx,
    )


def format_limits(lim: Limits) -> str:
    lines = [
        f"{lim.cpu}, {lim.threads} threads, last-level cache {lim.llc_bytes / 2**20:.0f} MiB",
        f"read a fresh {lim.read_bytes / 2**20:.0f} MiB buffer: {lim.read_gbps:.1f} GB/s"
        f" (best pass {lim.read_gbps_best:.1f})",
    ]
    for kind, _, what in PEAK_KINDS:
        if kind in lim.peaks:
            unit = "TOPS" if kind.startswith("int8") else "TFLOP/s"
            lines.append(f"{what:<42} {lim.peaks[kind] / 1e12:7.3f} {unit}")
    lines.append(f"AMX: {lim.amx}")
    return "\n".join(lines)


def format_calibration(cal) -> str:
    lines = [f"kernel levels (calibrated for {cal.cpu}, {cal.threads} threads; us per pass):"]
    chosen = {"decode": cal.decode, "batch": cal.batch, "linear_attn": cal.linear_attn}
    for use, figures in cal.timings.items():
        cells = "  ".join(
            f"{lv} {us:,.0f}{' *' if chosen.get(use) == lv else ''}" for lv, us in figures.items()
        )
        lines.append(f"  {use:<12} {cells}")
    lines.append("  (* the level kept)")
    return "\n".join(lines)


def main(args) -> int:
    from radixlm.kernels import build, calibrate

    if not build.load():
        print(f"native kernels unavailable: {build.unavailable_reason()}")
        return 1
    lim = measure(args.threads, args.read_mib)
    print(format_limits(lim))
    cal = None
    if os.environ.get(calibrate.ISA_ENV):
        print(f"kernel levels forced by {calibrate.ISA_ENV}={os.environ[calibrate.ISA_ENV]}")
    else:
        cal = calibrate.calibrate(build.build_dir(), force=args.recalibrate)
        calibrate.apply(cal)
        print(format_calibration(cal))
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump({"limits": asdict(lim), "calibration": cal and asdict(cal)}, f, indent=1)
    return 0
