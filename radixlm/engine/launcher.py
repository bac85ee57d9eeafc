"""Starting, watching and stopping the engine's child processes (scheduler, detokenizer).
See docs/architecture.md, "Processes"."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

from radixlm.config import PortArgs, ServerArgs
from radixlm.engine.tokenizer_manager import TokenizerManagerConfig

if TYPE_CHECKING:
    from radixlm.scheduler.config import SchedulerConfig


def check_server_args(server_args: ServerArgs) -> "SchedulerConfig":
    """The scheduler's config from the options; a ValueError naming the option when one is bad (each
    component's config validates its own)."""
    from radixlm.scheduler.config import SchedulerConfig

    TokenizerManagerConfig.from_server_args(server_args)
    return SchedulerConfig.from_server_args(server_args)


def launch_engine_processes(server_args: ServerArgs) -> tuple[list, PortArgs, dict]:
    """Start the scheduler and detokenizer processes; return them, the ports and the
    scheduler's info once its model is loaded (or raise with its error). A bad option is a
    ValueError here, before any process starts."""
    from radixlm.engine.detokenizer import run_detokenizer_process
    from radixlm.model.loader import default_model_path
    from radixlm.scheduler.scheduler import run_scheduler_process

    config = check_server_args(server_args)
    tokenizer_path = server_args.tokenizer_path or server_args.model_path or default_model_path()
    port_args = PortArgs.init_new()
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    sched = ctx.Process(
        target=run_scheduler_process, args=(config, port_args, writer), daemon=True, name="scheduler"
    )
    detok = ctx.Process(target=run_detokenizer_process, args=(tokenizer_path, server_args.log_level, port_args),
                        daemon=True, name="detokenizer")
    sched.start()
    detok.start()
    procs = [sched, detok]
    try:
        while not reader.poll(1.0):
            if not sched.is_alive():
                raise RuntimeError(f"the scheduler process died while starting (exit code {sched.exitcode})")
        info = reader.recv()
    except BaseException:
        stop_processes(procs, port_args)
        raise
    if info.get("status") != "ready":
        stop_processes(procs, port_args)
        raise RuntimeError(f"the scheduler failed to start: {info.get('message')}")
    return procs, port_args, info


def stop_processes(procs: list, port_args: Optional[PortArgs] = None, grace: float = 5.0) -> None:
    """SIGTERM (the scheduler finishes its storage writes, see run_scheduler_process), then SIGKILL
    what is left after `grace` seconds."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)
    if port_args is not None:
        port_args.cleanup()


def watch_processes(procs: list, on_dead: Callable[[str], None], stopped: Callable[[], bool], interval: float) -> threading.Thread:
    """A daemon thread that calls on_dead(message) once if a child process exits unasked."""

    def run():
        while not stopped():
            for p in procs:
                if not p.is_alive() and not stopped():
                    on_dead(f"the {p.name} process died (exit code {p.exitcode})")
                    return
            time.sleep(interval)

    t = threading.Thread(target=run, name="radixlm-watchdog", daemon=True)
    t.start()
    return t
