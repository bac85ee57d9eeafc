"""Which kernel level runs, chosen by measuring each on this machine, not by its CPU flags.

Every level of the quantized kernels (AVX2 tiles, AVX-512 VNNI tiles, the VBMI level's two weight
groups at a time) and of the delta rules' steps (AVX2, AVX-512) gives bitwise the same results
(tests/kernels/test_kernel_isas.py), so the level is a speed choice only, and the widest is not the
fastest everywhere: on a Zen 4 the VBMI level's decode GEMVs ran 1.6x slower than VNNI's (Zen 4
splits 512-bit work in two), on an Intel Xeon faster. When the ops are first used (kernels/ops.py),
each level is timed on weights of a decode step's shape (~30 MB: past the L2, like a model's; one
row reads copies of them past twice the last-level cache, so it streams from memory as a model's
step does: a 300 MB L3 held them all on an Intel Xeon, and its decode timings measured the cache),
for one activation row (decode), for 8, 64 and 256 rows (batches, prefill tiles) and for a decode
batch of the delta rule; the fastest is kept per use (of levels within 3% of each other, the
wider) and cached beside the built kernels, per CPU model and thread count, so later starts read
it (a few seconds, once). A machine busier than its CPUs (the load average) is not timed: the
flags' widest level runs until a quieter start measures.
`RADIXLM_KERNEL_ISA` still forces a level (nothing is measured); `RADIXLM_KERNEL_CALIBRATE=0` keeps
the widest level the flags allow, `=1` measures again;
`radixlm bench limits --recalibrate` measures again and prints the figures.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace

import torch

logger = logging.getLogger(__name__)

ISA_ENV = "RADIXLM_KERNEL_ISA"
CALIBRATE_ENV = "RADIXLM_KERNEL_CALIBRATE"
FILE = "calibration.json"

# A decode step's matrices in the formats a Q4_K_M file mixes (and gpt-oss's MXFP4): (format,
# rows, cols). ~29 MB of weights.
DECODE_WEIGHTS = (
    ("q4_k", 6144, 2048),
    ("q6_k", 2048, 6144),
    ("q8_0", 2048, 2048),
    ("q4_0", 2048, 2048),
    ("mxfp4", 2048, 2048),
)
# Rows of the batch level's timings: a decode batch, a chunk, a prefill (AMX's tiles differ from
# VBMI's only at 16 rows and more, and share their weight tiles over up to 256).
BATCH_ROWS = (8, 64, 256)
# Offsets and counts of the fp16 scales inside each format's GGUF block (random bytes elsewhere).
_FP16_SCALES = {"q4_k": (0, 2), "q6_k": (208, 1), "q8_0": (0, 1), "q4_0": (0, 1)}


@dataclass(frozen=True)
class Calibration:
    """The levels chosen and what each measured (microseconds per pass, the fastest of its
    rounds)."""

    decode: str  # the quantized GEMVs' level for one activation row
    batch: str  # ... for more rows
    linear_attn: str  # the delta rules' steps
    threads: int
    cpu: str
    timings: dict[str, dict[str, float]] = field(default_factory=dict)


def _ops():
    return torch.ops.radixlm


def qlinear_levels() -> list[str]:
    """The quantized kernels' levels this CPU runs, narrowest first."""
    return list(_ops().qlinear_isas())


def linear_attn_levels() -> list[str]:
    before = _ops().linear_attn_isa()
    try:
        _ops().linear_attn_isa("avx512")
        return ["avx2", "avx512"]
    except RuntimeError:
        return ["avx2"]
    finally:
        _ops().linear_attn_isa(before)


def llc_bytes() -> int:
    """The largest cache sysfs reports for CPU 0 (the last level), bytes."""
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KMG")) * unit)
    return best


def cpu_name() -> str:
    """The CPU's model name and a hash of its flags (the calibration's key)."""
    name, flags = "unknown CPU", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name == "unknown CPU":
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{name} [{hashlib.sha256(flags.encode()).hexdigest()[:8]}]"


def _random_weight(name: str, rows: int, cols: int, g: torch.Generator):
    """(interleaved weight, kernel format id) of random blocks with sane scales."""
    from radixlm.kernels.formats import FORMATS, INTERLEAVED

    fmt = FORMATS[name]
    raw = torch.randint(0, 256, (rows, fmt.row_bytes(cols)), dtype=torch.uint8, generator=g)
    blocks = raw.view(rows, -1, fmt.block_bytes)
    if name == "mxfp4":
        blocks[:, :, 0] = 120  # e8m0 exponent: 2^-7
    else:
        at, count = _FP16_SCALES[name]
        scales = (torch.rand(rows, blocks.shape[1], count, generator=g) * 0.02 + 1e-3).half()
        blocks[:, :, at : at + 2 * count] = scales.view(torch.uint8)
    packed = _ops().repack_x8(raw, fmt.kernel_id, cols)
    return packed, INTERLEAVED[name].kernel_id


def _fastest(levels: list[str], set_level, run, rounds: int) -> dict[str, float]:
    """Microseconds of `run` at each level: levels alternate round by round (a machine's phase
    moves every level alike), the fastest round kept."""
    best = {lv: float("inf") for lv in levels}
    for lv in levels:  # warm: first-touch pages, caches
        set_level(lv)
        run()
    for _ in range(rounds):
        for lv in levels:
            set_level(lv)
            t0 = time.perf_counter()
            run()
            best[lv] = min(best[lv], (time.perf_counter() - t0) * 1e6)
    return best


# Levels within this share of each other tie, and the wider one is kept: ~30 MB of weights at one
# row can tie (1,911 vs 1,912 us for VNNI and VBMI on an Intel Xeon) where a model's step does not
# (its 8B shape's decode step: 175-180 ms at the VBMI level, 192-195 ms at VNNI's).
TIE = 0.03


def _pick(timings: dict[str, float]) -> str:
    """The widest level (timings run narrowest first), unless a narrower one is faster by more
    than TIE."""
    levels = list(timings)
    best = levels[-1]
    for lv in reversed(levels[:-1]):
        if timings[lv] < timings[best] * (1 - TIE):
            best = lv
    return best


def measure(rounds: int = 7) -> Calibration:
    """Time every level on this machine and return the fastest per use (_pick; sets nothing)."""
    ops = _ops()
    saved_q, saved_la = list(ops.qlinear_levels()), ops.linear_attn_isa()
    g = torch.Generator().manual_seed(0)
    weights = [_random_weight(n, r, c, g) for n, r, c in DECODE_WEIGHTS]
    xs = {
        (m, cols): torch.randn(m, cols, generator=g)
        for m in (1, *BATCH_ROWS)
        for cols in {c for _, _, c in DECODE_WEIGHTS}
    }

    # One row streams its weights: copies past twice the last-level cache, each call another set.
    total = sum(w.numel() * w.element_size() for w, _ in weights)
    copies = max(1, min(32, -(-2 * llc_bytes() // total)))
    sets = [weights] + [[(w.clone(), fid) for w, fid in weights] for _ in range(copies - 1)]

    def gemms(m: int, repeats: int):
        def run():
            for r in range(repeats):
                ws = sets[r % len(sets)] if m == 1 else weights
                for (w, fid), (_, _, cols) in zip(ws, DECODE_WEIGHTS):
                    ops.qlinear(xs[m, cols], w, fid, None)

        return run

    timings: dict[str, dict[str, float]] = {}
    levels = qlinear_levels()
    try:
        # AMX is a level for more than one row (one row runs VBMI's kernels under it)
        timings["decode"] = _fastest(
            [lv for lv in levels if lv != "amx"],
            lambda lv: ops.qlinear_levels(lv, ""),
            gemms(1, max(3, copies)),
            rounds,
        )
        batch = {lv: 0.0 for lv in levels}
        for m in BATCH_ROWS:
            t = _fastest(levels, lambda lv: ops.qlinear_levels("", lv), gemms(m, 1), 3)
            timings[f"batch_{m}"] = t
            for lv in levels:
                batch[lv] += t[lv]
        timings["batch"] = batch
        timings["linear_attn"] = _fastest(
            linear_attn_levels(), ops.linear_attn_isa, _delta_rule_decode(g), rounds
        )
    finally:
        ops.qlinear_levels(*saved_q)
        ops.linear_attn_isa(saved_la)
    return Calibration(
        decode=_pick(timings["decode"]),
        batch=_pick(timings["batch"]),
        linear_attn=_pick(timings["linear_attn"]),
        threads=torch.get_num_threads(),
        cpu=cpu_name(),
        timings=timings,
    )


def _delta_rule_decode(g: torch.Generator):
    """A decode batch of Qwen3.5-0.8B's Gated DeltaNet shape (4 requests, 16 heads, 128 x 128
    float32 states: 4 MB) through the delta rule, repeated."""
    import torch.nn.functional as F

    t, h, d = 4, 16, 128
    q = F.normalize(torch.randn(t, h, d, generator=g), dim=-1) * d**-0.5
    k = F.normalize(torch.randn(t, h, d, generator=g), dim=-1)
    v = torch.randn(t, h, d, generator=g)
    gate = -F.softplus(torch.randn(t, h, generator=g))
    beta = torch.rand(t, h, generator=g)
    state = torch.randn(t, h, d, d, generator=g) * 0.1
    rows = torch.arange(t)

    def run():
        for _ in range(4):
            _ops().gated_delta_rule(q, k, v, gate, beta, state, rows, [1] * t)
            state.mul_(0.5)  # keeps the state bounded over the repeats

    return run


def apply(cal: Calibration) -> None:
    _ops().qlinear_levels(cal.decode, cal.batch)
    _ops().linear_attn_isa(cal.linear_attn)


def _key() -> str:
    return f"{cpu_name()} / {torch.get_num_threads()} threads"


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached(directory: str) -> Calibration | None:
    """This CPU's and thread count's calibration stored in `directory` (the built kernels'), if
    one was made."""
    entry = _read(os.path.join(directory, FILE)).get(_key())
    try:
        cal = Calibration(**entry) if entry else None
    except TypeError:  # a file from another version
        return None
    if cal is None or not {"decode", "batch", "linear_attn"} <= set(cal.timings):
        return cal
    # chosen again from the stored figures: a newer rule (_pick) applies without timing again
    t = cal.timings
    return replace(
        cal, decode=_pick(t["decode"]), batch=_pick(t["batch"]), linear_attn=_pick(t["linear_attn"])
    )


def calibrate(directory: str, force: bool = False) -> Calibration:
    """The calibration stored in `directory`, or a new one measured and stored there (force:
    always measure). One process measures at a time (others wait, then read its result)."""
    path = os.path.join(directory, FILE)
    with open(path + ".flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not force and (cal := cached(directory)) is not None:
            return cal
        logger.info("radixlm: timing the kernel levels on this CPU (once)")
        cal = measure()
        data = _read(path)
        data[_key()] = asdict(cal)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        return cal


def busy() -> str | None:
    """Why this machine is too busy to time kernels on (None: it is not): more runnable work over
    the last minute than this process has CPUs."""
    load, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
    return f"the machine is busy (load {load:.1f} on {cpus} CPUs)" if load > cpus else None


def ensure(directory: str) -> Calibration | None:
    """After the kernels load from `directory`: apply the calibrated levels, unless
    RADIXLM_KERNEL_ISA forces one or RADIXLM_KERNEL_CALIBRATE=0 keeps the flags' widest. Never
    raises: a failure keeps the flags' levels (the same results, maybe slower) with one warning."""
    if os.environ.get(ISA_ENV) or os.environ.get(CALIBRATE_ENV) == "0":
        return None
    force = os.environ.get(CALIBRATE_ENV) == "1"
    if not force and cached(directory) is None and (why := busy()) is not None:
        # Timings taken beside other work pick wrong levels, and they would be kept: measure at a
        # quieter start instead (=1 or `radixlm bench limits --recalibrate` measure anyway).
        logger.info("radixlm: %s: the CPU flags' kernel levels until a quieter start", why)
        return None
    try:
        cal = calibrate(directory, force=force)
        apply(cal)
        return cal
    except Exception as e:  # an unwritable cache, an op refused: the flags' levels stay
        logger.warning("radixlm kernel calibration failed (%s); using the CPU flags' levels", e)
        return None
