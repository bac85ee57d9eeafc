"""The multiprocessing context the engine's child processes (scheduler ranks, detokenizer) start
from. See docs/architecture.md, "Processes".

A spawned child imports torch and transformers itself: seconds of CPU for every process of every
start. `radixlm serve` imports them once and forks its children from itself while it is one thread
(fork_context). Elsewhere (a program's Engine, a restart, ranks of several nodes) a fork server
imports them once, in a fresh interpreter (so no thread or lock of the parent is inherited), and
each child forks from it already loaded. The child then takes the parent's
environment, working directory, stdout and stderr, as a spawned one would (parent_state,
run_child). What the preloaded modules read from the environment when imported is fixed in the
server, though: a parent whose such variables changed since it started the server spawns its
children instead.

The fork server's children hash strings with a fixed seed (the server's PYTHONHASHSEED: the set
one, else 0): tensor-parallel ranks must iterate their sets and dicts of strings in one order, on
every node. Children forked from `serve` share its seed: one node's ranks only."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

PRELOAD = "radixlm.engine.preload"
# Environment variables torch, libgomp, transformers and huggingface_hub read when imported.
# Not Triton's (TRITON_INTERPRET is read when a kernel is decorated): nothing preloaded imports
# triton, so a child imports it under its own environment (tests/engine/test_process_context.py).
_IMPORT_TIME_ENV = (
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "CUDA_",
    "XDG_",
    "LD_",
    "HOME",
)

_server_env: dict[str, str] | None = None  # what the fork server started with
_preload = [PRELOAD]  # what it imports


def preload_also(*modules: str) -> None:
    """Have the fork server import `modules` too, for a parent that forks more of radixlm from it
    (the tests' servers, tests/forked_servers.py). Before the server starts only."""
    if _server_env is not None:
        raise RuntimeError("the fork server has started: its imports are fixed")
    _preload.extend(m for m in modules if m not in _preload)


def _import_time_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(_IMPORT_TIME_ENV)}


@contextlib.contextmanager
def fixed_hash_seed():
    """PYTHONHASHSEED fixed (the set one, else 0) for the processes started meanwhile: ranks must
    iterate their sets and dicts of strings in one order."""
    old = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = old or "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONHASHSEED"]


def start_fork_server() -> None:
    """Start the fork server (it imports PRELOAD in the background) unless started: called early,
    so that its imports overlap the parent's own."""
    global _server_env
    if _server_env is not None or "forkserver" not in mp.get_all_start_methods():
        return
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(list(_preload))
    with fixed_hash_seed():
        forkserver.ensure_running()
    _server_env = _import_time_env()
    atexit.register(_stop_fork_server)


def _stop_fork_server() -> None:
    """At exit: stop the fork server and reap it, so that it does not outlive this process (the
    stdlib's server ends by itself, reparented, once it notices, after its imports when a refusal
    came first). Children still running are terminated first, as multiprocessing does for daemon
    children; the server, a template with nothing to save, is killed."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the stdlib's one server per process
    if server._forkserver_pid is None:
        return
    for p in mp.active_children():
        p.terminate()
        p.join(5)
    with contextlib.suppress(ProcessLookupError):
        os.kill(server._forkserver_pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        server._stop()  # closes its liveness pipe and reaps it


def fork_context():
    """For a launching process that runs no thread but its main one (`radixlm serve` before its
    HTTP server runs): the fork context, PRELOAD imported here first, so that every child inherits
    it and nothing is imported twice (a fork server imports it all again: seconds of CPU a start).
    None where another Python thread runs (a fork copies the locks it may hold, logging's among
    them), where this process has used CUDA (a forked child cannot) or the platform cannot fork:
    then child_context(). Native pools of numerical libraries
    are not counted: OpenBLAS's (numpy's) stops and restarts around a fork (pthread_atfork), and
    torch's OpenMP pool does not exist yet in a process that has run no torch op."""
    import importlib
    import threading

    if "fork" not in mp.get_all_start_methods() or threading.active_count() != 1:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return None  # a forked child cannot use CUDA once its parent has
    importlib.import_module(PRELOAD)
    return mp.get_context("fork")


def fork_server_context(environ: Mapping[str, str] | None = None):
    """The preloaded fork server's context (started if it was not) where the platform has one and
    the environment it imported under is still `environ`'s (this process's by default), else
    None."""
    start_fork_server()
    if _server_env is None or _import_time_env(environ) != _server_env:
        return None
    return mp.get_context("forkserver")


def child_context():
    """The context to start the engine's children from: the preloaded fork server where the
    platform has one and the environment it imported under is still this process's, else spawn."""
    return fork_server_context() or mp.get_context("spawn")


class ParentStdio:
    """The parent's stdout and stderr as they are when the child starts (a redirect, pytest's
    capture): a forked child has the fork server's. Passed as file descriptors when pickled for the
    child (multiprocessing's DupFd)."""

    def __getstate__(self):
        from multiprocessing import reduction

        return {fd: reduction.DupFd(fd) for fd in (1, 2) if _is_open(fd)}

    def __setstate__(self, state):
        self.fds = {target: dup.detach() for target, dup in state.items()}

    def attach(self) -> None:
        # Not pickled (a forked child): it has the parent's already.
        for target, fd in getattr(self, "fds", {}).items():
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class ParentState:
    environ: dict[str, str]
    cwd: str
    stdio: ParentStdio


def parent_state() -> ParentState:
    return ParentState(dict(os.environ), os.getcwd(), ParentStdio())


def _release_fork_server() -> None:
    """A forked child holds the fork server's liveness pipe (so that it could start processes
    through the server too), which keeps the server, its parent, alive when the launching process
    dies. Closed, the server exits with the launching process and the child with the server
    (kill_itself_when_parent_died)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the stdlib's one server per process
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and server._forkserver_pid is None:  # a child, not the launching process
        os.close(fd)
        server._forkserver_alive_fd = None
        server._forkserver_address = None


def run_child(state: ParentState, target: Callable, *args) -> None:
    """A child's entry point: the parent's stdout and stderr, environment and directory (a forked
    child has the fork server's), then target(*args)."""
    from radixlm.utils import set_process_name

    _release_fork_server()
    set_process_name(mp.current_process().name)  # "scheduler", "detokenizer", ...
    state.stdio.attach()
    if os.environ != state.environ:
        os.environ.clear()
        os.environ.update(state.environ)
    if os.getcwd() != state.cwd:
        os.chdir(state.cwd)
    target(*args)


def child_process(ctx, target: Callable, args: tuple, name: str):
    """A daemon process of ctx running target(*args) in the parent's environment (not started)."""
    return ctx.Process(
        target=run_child, args=(parent_state(), target, *args), daemon=True, name=name
    )
