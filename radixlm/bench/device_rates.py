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


def read_rate_gbps(device, nbytes: int = 256 * 2**20, repeats: int = 7) -> float:
    """The machine's plain read rate (a sum over a buffer far larger than the caches), GB/s. On CUDA
    the device-to-device copy rate instead (copy_rate_gbps): what HBM sustains, the usual roofline.
    """
    import torch

    if torch.device(device).type == "cuda":
        return copy_rate_gbps(device)
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
