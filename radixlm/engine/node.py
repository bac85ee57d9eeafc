"""`radixlm serve --node-rank K` for K > 0: a node that runs its tensor-parallel ranks and no HTTP
server (rank 0, on node 0, talks to the tokenizer manager). See docs/architecture.md, "Tensor
parallelism"."""

from __future__ import annotations

import logging
import signal
import sys
import time

from radixlm.config import ServerArgs
from radixlm.distributed.config import DistConfig
from radixlm.engine.launcher import check_server_args, stop_processes, watch_processes
from radixlm.engine.process_context import child_context
from radixlm.engine.tp_launch import start_ranks, wait_ready
from radixlm.errors import StartupRefusalError

logger = logging.getLogger(__name__)


def run_node(server_args: ServerArgs) -> None:
    """`radixlm serve --node-rank K` (K > 0): this node's ranks, no HTTP server. Returns when they
    end: exit code 1 when one died (or, with --restart-on-failure, start them again)."""
    from radixlm.utils import configure_logging

    configure_logging(server_args.log_level)
    config = check_server_args(server_args)
    dist = DistConfig.from_server_args(server_args)
    ctx = child_context()
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        started = start_ranks(ctx, config, dist, None)
        procs = [p for p, _ in started]
        try:
            wait_ready(started)
        except RuntimeError as e:
            stop_processes(procs)
            print(f"radixlm: error: node {dist.node_rank}: {e}", file=sys.stderr, flush=True)
            sys.exit(2 if isinstance(e, StartupRefusalError) else 1)  # a refusal: as the parser's
        print(
            f"radixlm node {dist.node_rank}: ranks {dist.node_ranks()} ready (rank 0 at"
            f" {dist.dist_init_addr})",
            flush=True,
        )
        dead: list[str] = []
        watch_processes(
            procs, dead.append, lambda: stopping or bool(dead), server_args.watchdog_interval
        )
        while not stopping and not dead:
            time.sleep(0.1)
        stop_processes(procs, grace=1.0)
        if stopping:
            return
        if not server_args.restart_on_failure:
            print(
                f"radixlm: error: node {dist.node_rank}: {dead[0]}; this node stops"
                " (--restart-on-failure starts its ranks again)",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(1)
        logger.error(
            "node %d: %s; starting its ranks again (--restart-on-failure)", dist.node_rank, dead[0]
        )
