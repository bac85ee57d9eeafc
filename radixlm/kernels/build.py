"""Build and load the native CPU kernels (csrc/*.cpp) as torch ops under torch.ops.radixlm.

Built on first use with the machine's C++ compiler through torch's extension tooling, into a cache
directory keyed by the sources, the flags and the torch version, so a rebuild happens only when one
of them changes (~25 s on 2 cores, progress on stderr). AVX2+FMA+F16C is the baseline, checked at
run time before loading; never -march=native (some VMs report flags they cannot execute). Anything
that goes wrong gives one warning line and `load()` returns False: callers keep the torch path.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import logging
import os
import sys
import threading

import torch

logger = logging.getLogger(__name__)

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
# -ffp-contract=off: scalar a * b + c stays two roundings everywhere; GCC would fuse it into an FMA
# in some inlined copies of a kernel and not in others, and a row's result would depend on which
# tile shape computed it (the kernels promise batch invariance).
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-DNDEBUG"]
LDFLAGS = ["-fopenmp"]
DISABLE_ENV = "RADIXLM_DISABLE_KERNELS"  # =1: never build or load (the torch path everywhere)

_lock = threading.Lock()
_state: dict = {}  # "ok": bool, "reason": str


def cpu_supported() -> tuple[bool, str]:
    """AVX2, FMA and F16C as the OS reports them (torch's own cpuinfo check says AVX2 or better;
    /proc/cpuinfo adds FMA and F16C, which AVX2 CPUs have in practice)."""
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        return False, f"CPU capability {torch.backends.cpu.get_cpu_capability()} (need AVX2)"
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        flags = []
    missing = [f for f in ("avx2", "fma", "f16c") if flags and f not in flags]
    return (not missing), (f"CPU lacks {', '.join(missing)}" if missing else "")


def sources() -> list[str]:
    return sorted(glob.glob(os.path.join(CSRC, "*.cpp")))


# Parsing torch's headers costs ~10 s per translation unit, more than most kernels themselves: the
# sources compile as this many unity files (one per core of a 2-core machine), not one unit each.
UNITY_UNITS = 2


def unity_sources(directory: str) -> list[str]:
    """Write the unity files into `directory` (each #includes a share of csrc/*.cpp, balanced by
    size) and return the sources to compile: them, plus each file that sets `#pragma GCC target`
    (it compiles alone: the pragma would reach every file after it in a unity file). A unity file
    is rewritten only when its text changes, so ninja's timestamps stay valid."""
    alone = [p for p in sources() if "#pragma GCC target" in _read(p)]
    groups: list[list[str]] = [[] for _ in range(UNITY_UNITS)]
    sizes = [0] * UNITY_UNITS
    shared = [p for p in sources() if p not in alone]
    for path in sorted(shared, key=os.path.getsize, reverse=True):
        i = sizes.index(min(sizes))
        groups[i].append(path)
        sizes[i] += os.path.getsize(path)
    paths = []
    for i, group in enumerate(groups):
        text = "".join(f'#include "{p}"\n' for p in sorted(group))
        path = os.path.join(directory, f"unity_{i}.cpp")
        if not os.path.isfile(path) or _read(path) != text:
            with open(path, "w") as f:
                f.write(text)
        paths.append(path)
    return paths + alone


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def build_dir() -> str:
    h = hashlib.sha256()
    for path in sources() + sorted(glob.glob(os.path.join(CSRC, "*.h"))):
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + f.read())
    h.update(
        " ".join(CFLAGS + LDFLAGS).encode()
        + torch.__version__.encode()
        + sys.version.encode()
        + f"unity{UNITY_UNITS}".encode()
    )
    # ninja's build file names the sources by path: two checkouts sharing one directory would
    # rebuild it for each other at every start.
    h.update(CSRC.encode())
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm"
    )
    return os.path.join(root, "kernels", h.hexdigest()[:16])


def _ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the PyPI ninja (a dependency) may live in an unactivated
    venv."""
    try:
        import ninja
    except ImportError:
        return
    if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _build_and_load() -> None:
    from torch.utils import cpp_extension

    _ninja_on_path()
    directory = build_dir()
    os.makedirs(directory, exist_ok=True)
    lib = os.path.join(directory, "radixlm_kernels.so")
    if not os.path.isfile(lib):
        print(
            f"radixlm: building native CPU kernels into {directory} (first use, under a minute)...",
            file=sys.stderr,
            flush=True,
        )
    # torch's build lock is a plain file that a builder killed mid-build leaves behind, and every
    # later start then waits on it forever. Builders take this flock (the kernel drops it when a
    # process dies) first, so a `lock` file found while holding it is such a leftover.
    with open(os.path.join(directory, ".build.flock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = os.path.join(directory, "lock")
        if os.path.exists(stale):
            os.remove(stale)
        _load_extension(cpp_extension, directory, lib)


def _load_extension(cpp_extension, directory: str, lib: str) -> None:
    # verbose shows ninja's [i/n] progress while it compiles; nothing when the cache is warm.
    cpp_extension.load(
        name="radixlm_kernels",
        sources=unity_sources(directory),
        extra_cflags=list(
            CFLAGS
        ),  # torch appends to the list it is given: build_dir() hashes CFLAGS
        extra_ldflags=list(LDFLAGS),
        build_directory=directory,
        is_python_module=False,
        verbose=not os.path.isfile(lib),
    )


def load() -> bool:
    """Build (once) and load the kernels; True when torch.ops.radixlm is usable."""
    with _lock:
        if "ok" in _state:
            return _state["ok"]
        reason = ""
        if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
            reason = f"{DISABLE_ENV} is set"
        else:
            ok, reason = cpu_supported()
            if ok:
                try:
                    _build_and_load()
                except Exception as e:  # no compiler, no ninja, a compile error, a load error
                    reason = (
                        f"{type(e).__name__}:"
                        f" {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                    )
        _state["ok"], _state["reason"] = not reason, reason
        if reason and os.environ.get(DISABLE_ENV, "") in ("", "0"):
            logger.warning(
                "radixlm native CPU kernels unavailable (%s); using the torch path", reason
            )
        return _state["ok"]


def unavailable_reason() -> str:
    return _state.get("reason", "not loaded yet")
