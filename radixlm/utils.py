"""Process plumbing shared by the engine's processes."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys


def configure_logging(level: str = "info", prefix: str = "") -> None:
    fmt = f"[%(asctime)s{' ' + prefix if prefix else ''}] %(levelname)s %(message)s"
    logging.basicConfig(
        level=getattr(logging, level.upper()), format=fmt, datefmt="%H:%M:%S", force=True
    )


def host_threads() -> int:
    """The threads an engine on this host may use unless --num-threads says: OMP_NUM_THREADS where
    set (the variable torch and every OpenMP program read), else every core."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return os.cpu_count() or 1


def set_process_name(name: str) -> None:
    """Linux: the name `ps`, `top` and psutil show for this process (its first 15 bytes), e.g.
    "scheduler" or "detokenizer" for the engine's children instead of their parent's "python"."""
    if sys.platform != "linux":
        return
    PR_SET_NAME = 15
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def kill_itself_when_parent_died(sig: int = signal.SIGKILL) -> None:
    """Linux: get `sig` when the parent dies, so no child outlives a crashed launcher (SIGTERM: a
    server that stops its own children first)."""
    if sys.platform != "linux":
        return
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() == 1:  # the parent already died before prctl
        os.kill(os.getpid(), sig)


def core_shares(n: int, cores: list[int]) -> list[list[int]]:
    """n disjoint, near-equal slices of the cores (each at least one core; shared when n >
    cores)."""
    if n <= len(cores):
        per, extra = divmod(len(cores), n)
        out, i = [], 0
        for k in range(n):
            size = per + (1 if k < extra else 0)
            out.append(cores[i : i + size])
            i += size
        return out
    return [[cores[k % len(cores)]] for k in range(n)]


def kill_process_tree(pid: int, include_self: bool = True) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    children = proc.children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=5)
    if include_self:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)


def keep_freed_memory_in_heap() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the OS.

    By default glibc serves big allocations (a prefill's activations: MBs each) with fresh mmaps
    and trims freed heap memory, so every forward re-faults its activations page by page: ~20%
    of a 1,024-token CPU prefill (docs/benchmarks.md). Call it after loading: the loader sets
    glibc's threshold for its own copies (model/memory/weight_memory.py). Returns False where it
    does not apply (not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(
            libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 31)
        )
    except (OSError, AttributeError):
        return False


def common_prefix_len(a, b) -> int:
    """Length of the longest common prefix of two lists or strings (slices compare at C speed:
    a binary search over them instead of a Python loop per element)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
