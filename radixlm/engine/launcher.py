"""Starting, watching and stopping the engine's child processes (scheduler, detokenizer).
See docs/architecture.md, "Processes".

The watchdog ends the engine when a child process exits, when a tp rank stops beating its
heartbeat, when the scheduler's or the detokenizer's loop completes no iteration for
--watchdog-timeout seconds while a request (or a control call) has waited that long (its loop
heartbeat; an idle loop still beats once a second), or when the tokenizer manager's receive loop
failed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from radixlm.config import PortArgs, ServerArgs
from radixlm.distributed.config import DistConfig
from radixlm.distributed.rank import HEARTBEAT_TIMEOUT, heartbeat_age, new_heartbeat
from radixlm.engine.observability import check_observability_args
from radixlm.engine.process_context import child_context, child_process, fork_context
from radixlm.engine.sessions import SessionConfig
from radixlm.engine.tokenizer_manager_config import TokenizerManagerConfig
from radixlm.model import sampling_defaults
from radixlm.reasoning import get_reasoning_format

if TYPE_CHECKING:
    from radixlm.scheduler.config import SchedulerConfig


def check_server_args(server_args: ServerArgs) -> SchedulerConfig:
    """The scheduler's config from the options; a ValueError naming the option when one is bad (each
    component's config validates its own)."""
    from radixlm.scheduler.config import SchedulerConfig

    TokenizerManagerConfig.from_server_args(server_args)
    check_observability_args(server_args)
    sampling_defaults.check_mode(server_args.sampling_defaults)
    if server_args.reasoning_parser is not None:
        get_reasoning_format(server_args.reasoning_parser)  # a ValueError naming the choices
    SessionConfig.from_server_args(server_args)
    dist = DistConfig.from_server_args(server_args)
    if dist.enable_dp_attention:
        _check_dp_attention(server_args)
    elif server_args.dp_size > 1 and (dist.nnodes > 1 or dist.dist_init_addr):
        raise ValueError(
            "dp_size > 1 runs each replica's tp group on this host at its own free port: leave "
            "nnodes at 1 and dist_init_addr unset"
        )
    if dist.enabled and server_args.hicache_storage_backend:
        raise ValueError(
            "hicache_storage_backend (L3) is not supported with tp_size > 1 yet: its reads and"
            " writes finish at a different moment on each rank (the hierarchical cache's L2 is)"
        )
    if dist.pp_size > 1:
        _check_pipeline(server_args, dist)
    return SchedulerConfig.from_server_args(server_args)


def _check_dp_attention(server_args: ServerArgs) -> None:
    """What DP attention does not run with yet (each rank's step must launch one forward after the
    step's exchange: parallel/dp_attention.py)."""
    refused = {
        "speculative_algorithm": server_args.speculative_algorithm,
        "enable_overlap_schedule": server_args.enable_overlap_schedule,
        "enable_torch_compile": server_args.enable_torch_compile,
        "disaggregation_mode": (
            server_args.disaggregation_mode != "null" and server_args.disaggregation_mode
        ),
    }
    for name, value in refused.items():
        if value:
            raise ValueError(f"{name} is not supported with enable_dp_attention yet")


def _check_pipeline(server_args: ServerArgs, dist: DistConfig) -> None:
    """--pp-size against the model's layers (and --pp-layer-partition), before any process
    starts."""
    import os

    from radixlm.distributed.pp_partition import layer_counts
    from radixlm.model.loader import default_model_path, load_model_config

    if (
        server_args.is_embedding
    ):  # the pooled partials are the last stage's, and nothing sends them back
        raise ValueError("is_embedding is not supported with pp_size > 1")
    if server_args.pp_max_micro_batch_size is not None and server_args.pp_max_micro_batch_size < 1:
        raise ValueError(
            f"pp_max_micro_batch_size must be >= 1, got {server_args.pp_max_micro_batch_size}"
        )
    path = server_args.model_path or default_model_path()
    if os.path.exists(
        path
    ):  # a hub id is resolved later (the ranks check again as they build the model)
        text = load_model_config(path).get_text_config()  # a model with images: its decoder's
        layer_counts(text.num_hidden_layers, dist.pp_size, dist.pp_layer_partition)


def launch_engine_processes(
    server_args: ServerArgs, fork_ok: bool = False, tokenizer=None
) -> tuple[list, PortArgs, dict]:
    """Start the scheduler (with --tp-size, this node's scheduler ranks) and detokenizer processes;
    return them (the scheduler or rank 0 first, the detokenizer second), the ports and the
    scheduler's info once its model is loaded (or raise with its error). A bad option is a
    ValueError here, before any process starts, or a StartupRefusalError (a ValueError too) when
    only a child can tell (the attention backend on this device, the model's head count).
    fork_ok: this process may fork its children (process_context.fork_context: `serve` before its
    server runs) where they run on this node only (ranks of other nodes hash with the fork server's
    fixed seed). tokenizer: the caller's, loaded from the tokenizer path: a detokenizer forked
    from it takes it with the memory it inherits instead of loading its own (a large vocabulary:
    seconds). The scheduler still loads its own when a request first needs it (stop strings,
    grammars; tests/e2e/test_internal_errors.py fails that load on purpose)."""
    from radixlm.engine.detokenizer import run_detokenizer_process
    from radixlm.engine.tp_launch import start_ranks, wait_ready
    from radixlm.model.loader import default_model_path
    from radixlm.scheduler.scheduler import run_scheduler_process

    config = check_server_args(server_args)
    dist = DistConfig.from_server_args(server_args)
    if dist.node_rank != 0:
        raise ValueError(
            "node_rank > 0 runs its ranks only (radixlm serve --node-rank K), no engine front end"
        )
    tokenizer_path = server_args.tokenizer_path or server_args.model_path or default_model_path()
    port_args = PortArgs.init_new()
    ctx = (fork_ok and dist.nnodes == 1 and fork_context()) or child_context()
    # Only to a forked child: any other would get it pickled, slower than loading it.
    detok_tokenizer = tokenizer_path
    if tokenizer is not None and ctx.get_start_method() == "fork":
        detok_tokenizer = tokenizer
    if dist.enabled:
        started = start_ranks(ctx, config, dist.with_init_addr(), port_args)
    else:
        reader, writer = ctx.Pipe(duplex=False)
        loop_heartbeat = new_heartbeat(ctx)
        sched = child_process(
            ctx,
            run_scheduler_process,
            (config, port_args, writer, None, loop_heartbeat),
            name="scheduler",
        )
        sched.loop_heartbeat = loop_heartbeat
        sched.start()
        started = [(sched, reader)]
    detok_heartbeat = new_heartbeat(ctx)
    detok = child_process(
        ctx,
        run_detokenizer_process,
        (detok_tokenizer, server_args.log_level, port_args, detok_heartbeat),
        name="detokenizer",
    )
    detok.loop_heartbeat = detok_heartbeat
    detok.start()
    ranks = [p for p, _ in started]
    procs = [ranks[0], detok, *ranks[1:]]
    try:
        infos = wait_ready(started, [detok])
        info = infos[0]
    except BaseException:
        stop_processes(procs, port_args)
        raise
    defaults = sampling_defaults.applied(
        server_args.sampling_defaults, info.get("model_sampling_defaults", {})
    )
    return (
        procs,
        port_args,
        {
            **info,
            **_dp_capacity(infos, dist),
            "tp_size": dist.tp_size,
            "pp_size": dist.pp_size,
            "sampling_defaults": defaults,
            "reasoning_parser": server_args.reasoning_parser,
        },
    )


def _dp_capacity(infos: list[dict], dist: DistConfig) -> dict:
    """DP attention: the engine's KV is every rank's pool (each rank's own requests in its own)."""
    if not dist.enable_dp_attention:
        return {}
    return {
        "dp_size": dist.dp_size,
        **{k: sum(i[k] for i in infos) for k in ("max_total_num_tokens", "kv_cache_bytes")},
    }


def stop_processes(procs: list, port_args: PortArgs | None = None, grace: float = 5.0) -> None:
    """SIGTERM (the scheduler finishes its storage writes, see run_scheduler_process), then SIGKILL
    what is left after `grace` seconds; a rank that stopped beating is hung: SIGKILL at once (its
    peers, waiting in a collective with it, then fail and exit)."""
    for p in procs:
        if p.is_alive() and heartbeat_age(getattr(p, "heartbeat", None)) > HEARTBEAT_TIMEOUT:
            p.kill()
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


class WatchedFrontEnd(Protocol):
    """What the watchdog reads of the tokenizer manager (from its own thread)."""

    loop_failure: str | None  # set when its receive loop failed: the engine is unusable

    def pending_age(self) -> float:
        """Seconds the oldest request or control call still waiting on the engine has waited (0:
        none)."""


def watch_processes(
    procs: list,
    on_dead: Callable[[str], None],
    stopped: Callable[[], bool],
    interval: float,
    front: WatchedFrontEnd | None = None,
    watchdog_timeout: float | None = None,
) -> threading.Thread:
    """A daemon thread that calls on_dead(message) once if a child process exits unasked, a
    scheduler rank stops beating its heartbeat, or (with front and watchdog_timeout) a loop stalls
    with work pending or the front end's receive loop failed."""

    def run():
        while not stopped():
            message = dead_message(procs)
            if not message and front is not None:
                message = stalled_message(procs, front, watchdog_timeout) or front.loop_failure
            if message and not stopped():
                on_dead(message)
                return
            time.sleep(interval)

    t = threading.Thread(target=run, name="radixlm-watchdog", daemon=True)
    t.start()
    return t


def dead_message(procs: list) -> str | None:
    """One message for the processes that died or hung (killed here), None when all live. A tp
    rank's death makes its peers fail too: the ones killed by a signal (the cause, usually) are
    named first."""
    hung = [
        p
        for p in procs
        if p.is_alive() and heartbeat_age(getattr(p, "heartbeat", None)) > HEARTBEAT_TIMEOUT
    ]
    if hung:
        p = hung[0]
        age = heartbeat_age(p.heartbeat)
        for h in (
            hung
        ):  # nothing to save in a hung rank; its peers, waiting on it in a collective, fail now
            h.kill()
        return f"the {p.name} process (pid {p.pid}) hung: no heartbeat for {age:.1f} s; killed"
    dead = sorted((p for p in procs if not p.is_alive()), key=lambda p: (p.exitcode or 0) >= 0)
    if not dead:
        return None
    first, rest = dead[0], dead[1:]
    also = f"; also exited: {', '.join(f'{p.name} ({p.exitcode})' for p in rest)}" if rest else ""
    return f"the {first.name} process died (exit code {first.exitcode}){also}"


def stalled_message(procs: list, front: WatchedFrontEnd, timeout: float | None) -> str | None:
    """A message for a process whose loop completed no iteration for more than timeout seconds
    while the oldest pending request (or control call) waited as long (killed here: a hung loop has
    nothing left to save); None when none stalls."""
    if timeout is None:
        return None
    for p in procs:
        since = min(heartbeat_age(getattr(p, "loop_heartbeat", None)), front.pending_age())
        if since > timeout and p.is_alive():
            p.kill()
            return (
                f"the {p.name} process (pid {p.pid}) hung: no loop iteration for {since:.1f} s with"
                f" requests waiting (--watchdog-timeout {timeout:g}); killed"
            )
    return None
