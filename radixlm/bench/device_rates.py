"""Timing on a device and its memory rates, for the benchmarks' rooflines (bench/one_batch.py)."""

from __future__ import annotations

import statistics
import time


class DeviceTimer:
    """perf_counter, after the device's queued work is done (CUDA is asynchronous)."""

    def __init__(self, device):
        import torch

        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()


def read_rate_gbps(device, nbytes: int | None = None, repeats: int = 7) -> float:
    """The machine's plain read rate (a sum over a buffer far larger than the caches: 256 MiB, or
    twice the last-level cache where that is larger, e.g. a 260 MiB L3), GB/s. On CUDA the
    device-to-device copy rate instead (copy_rate_gbps): what HBM sustains, the usual roofline.
    """
    import torch

    if torch.device(device).type == "cuda":
        return copy_rate_gbps(device)
    if nbytes is None:
        from radixlm.bench.limits import llc_bytes

        nbytes = max(256 * 2**20, 2 * llc_bytes())
    x = torch.ones(nbytes // 4, device=device)
    timer = DeviceTimer(torch.device(device))
    times = []
    for _ in range(repeats):
        t0 = timer.now()
        x.sum()
        times.append(timer.now() - t0)
    return nbytes / statistics.median(times) / 1e9


def copy_rate_gbps(device, nbytes: int = 2**30, repeats: int = 10) -> float:
    """A device-to-device copy of nbytes, counting the bytes read and written (GB/s): ~4.3 TB/s on
    an H200 (measured by others on the lent machines), against its 4.8 TB/s nominal."""
    import torch

    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    timer = DeviceTimer(torch.device(device))
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = timer.now()
        dst.copy_(src)
        times.append(timer.now() - t0)
    return 2 * nbytes / statistics.median(times) / 1e9


def tensors_read_rate_gbps(tensors, min_bytes: int = 8 * 2**20, repeats: int = 3) -> float | None:
    """The rate these tensors' own memory reads at (GB/s, CPU): each of at least min_bytes streamed
    once per repeat (an int64 max: no float assists on random bits), its fastest pass kept, total
    bytes over total time. On this VM class one buffer's pages can read 2x faster than another's, so
    a step's weights are measured where they are, not on a fresh buffer. None: no such tensor."""
    import torch

    total_bytes, total_s = 0, 0.0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n < min_bytes or n % 8 or not t.is_contiguous() or t.device.type != "cpu":
            continue
        try:
            flat = t.reshape(-1).view(torch.uint8).view(torch.int64)
        except RuntimeError:  # a view at an offset an int64 view cannot take
            continue
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            flat.max()
            best = min(best, time.perf_counter() - t0)
        total_bytes, total_s = total_bytes + n, total_s + best
    return total_bytes / total_s / 1e9 if total_bytes else None
