"""What the fork server imports fixes what its children inherit: Triton's variables are left out
of the environment it must share with its parent (process_context._IMPORT_TIME_ENV) because
nothing it preloads imports triton, whose interpreter switch is read when a kernel is decorated."""

import subprocess
import sys

from radixlm.engine import process_context
from tests.forked_servers import SERVER_PRELOAD


def test_the_preloads_do_not_import_triton():
    modules = [process_context.PRELOAD, *SERVER_PRELOAD]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
    assert not any(p.startswith("TRITON") for p in process_context._IMPORT_TIME_ENV)


def test_no_fork_once_this_process_has_used_cuda():
    """A child forked from a process that initialized CUDA cannot use it ("Cannot re-initialize
    CUDA in forked subprocess", seen on the H200 when an Engine started in a pytest worker that had
    run a CUDA test): the launcher then takes the fork server or spawn instead. In a fresh
    interpreter (fork_context also refuses a process running other threads, as pytest's may)."""
    out = subprocess.run(
        [sys.executable, "-c", _NO_FORK_AFTER_CUDA], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.split() == ["fork", "None"], out.stderr


_NO_FORK_AFTER_CUDA = """
import torch
from radixlm.engine import process_context
print(process_context.fork_context().get_start_method())
torch.cuda.is_initialized = lambda: True
print(process_context.fork_context())
"""
