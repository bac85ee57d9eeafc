"""The quantized linear kernels alone, on a GGUF's own tensors: time per call, weight bytes read per
second (the decode figure) and multiply-adds per second (the prefill figure), for each tensor kind
of one layer plus the LM head, at a few batch sizes.

    python benchmarks/qlinear.py /data/llama-3.2-1b.q4_k_m.gguf --rows 1 8 64 512

Weights go through the loader's own path (QuantizedMatrix: interleaved where the format has a
layout for it), so the figures are the engine's. Medians over --repeat calls after a warm-up.
--cold: each call reads another copy of the weight, --cold-mb of copies in all, so the weights come
from memory as in a model's step (a warm matrix sits in the last-level cache).
--levels: the kernel levels to set side by side (e.g. `avx512vbmi amx`), alternated call by call so
a VM's phase moves them alike; each cell then gives every level's time and the first ÷ the last.

    python benchmarks/qlinear.py FILE --rows 64 512 --levels avx512vbmi amx
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixlm.kernels.formats import format_of_ggml  # noqa: E402 (after the sys.path insert above)
from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor  # noqa: E402 (after the sys.path insert above)

# One layer's matrices and the LM head: the names llama.cpp writes.
KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def pick_tensors(path: str, names: list[str] | None = None) -> list:
    import gguf

    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    if names:
        missing = [n for n in names if n not in by_name]
        if missing:
            raise SystemExit(f"--tensor: not in {path}: {', '.join(missing)}")
        return [by_name[n] for n in names]
    chosen = [by_name[f"blk.0.{k}.weight"] for k in KINDS if f"blk.0.{k}.weight" in by_name]
    chosen.append(by_name.get("output.weight") or by_name["token_embd.weight"])
    return chosen


def median_us_levels(fn, repeat: int, levels: list[str]) -> dict[str, float]:
    """Median microseconds of fn at each kernel level (both uses set), alternating call by call."""
    ops = torch.ops.radixlm
    saved = list(ops.qlinear_levels())
    times = {lv: [] for lv in levels}
    try:
        for lv in levels:  # warm each
            ops.qlinear_isa(lv)
            fn()
        for _ in range(repeat):
            for lv in levels:
                ops.qlinear_isa(lv)
                t = time.perf_counter()
                fn()
                times[lv].append(time.perf_counter() - t)
    finally:
        ops.qlinear_levels(*saved)
    return {lv: statistics.median(ts) * 1e6 for lv, ts in times.items()}


def median_us(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("gguf")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument(
        "--cold", action="store_true", help="rotate over copies of each weight (memory, not cache)"
    )
    p.add_argument("--cold-mb", type=float, default=512.0)
    p.add_argument(
        "--tensor", nargs="+", help="these GGUF tensors only (default: one layer's and the LM head)"
    )
    p.add_argument("--levels", nargs="+", help="kernel levels side by side (qlinear_isas())")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(
        "| tensor | type | out x in | MB | "
        + " | ".join(f"M={m} us (GB/s, GMAC/s)" for m in a.rows)
        + " |"
    )
    print("|---" * (4 + len(a.rows)) + "|")
    for t in pick_tensors(a.gguf, a.tensor):
        fmt = format_of_ggml(t.tensor_type)
        rows, cols = int(t.shape[1]), int(t.shape[0])
        data = torch.from_numpy(
            np.ascontiguousarray(t.data).view(np.uint8).reshape(rows, -1).copy()
        )
        mat = QuantizedMatrix([QuantizedTensor(data, fmt, cols)])
        mb = mat.nbytes / 1e6
        copies = [mat] + [
            QuantizedMatrix([QuantizedTensor(data.clone(), fmt, cols)])
            for _ in range(int(a.cold_mb / mb) if a.cold else 0)
        ]
        cells = []
        for m in a.rows:
            x = torch.randn(m, cols)
            turn = iter(range(1 << 62))
            call = lambda: copies[next(turn) % len(copies)].matmul(x)
            repeat = a.repeat if m <= 64 else max(3, a.repeat // 4)
            if a.levels:
                us = median_us_levels(call, repeat, a.levels)
                cells.append(
                    " / ".join(f"{lv} {t:.0f}" for lv, t in us.items())
                    + f" ({us[a.levels[0]] / us[a.levels[-1]]:.2f}x)"
                )
                continue
            us = median_us(call, repeat)
            cells.append(f"{us:.0f} ({mb * 1e6 / us / 1e3:.1f}, {m * rows * cols / us / 1e3:.0f})")
        print(
            f"| {t.name} | {'+'.join(mat.formats)} | {rows} x {cols} | {mb:.1f} | "
            + " | ".join(cells)
            + " |"
        )


if __name__ == "__main__":
    main()
