"""`radixlm serve --dp N`: N radixlm servers behind the cache-aware router, as one endpoint.

Each server is a child `radixlm serve` on a loopback port with its share of the cores (its torch
threads and, where the OS allows, its CPU affinity); the router runs in this process on
--host/--port with --api-key and --admin-api-key, and reaches the servers with keys of its own
(a user key and an admin key, handed to them in the environment, never on a command line).
Stopping this process (SIGINT, SIGTERM) stops every server.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import sys

from radixlm.cache.hicache_config import STORAGE_KEY_ENV
from radixlm.cache.kv_events_config import kv_events_for_rank
from radixlm.config import ServerArgs
from radixlm.engine.launcher import check_server_args
from radixlm.http_access import ADMIN_API_KEY_ENV, API_KEY_ENV, parse_origins
from radixlm.utils import core_shares


def launch_dp(server_args: ServerArgs) -> None:
    from radixlm.router.launch import run_router
    from radixlm.router.state import RouterArgs
    from radixlm.server.process import ServerProcess

    check_server_args(server_args)  # a bad option: one error here, not one per server
    origins = parse_origins(server_args.allowed_origins)
    n = server_args.dp_size
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    shares = core_shares(n, cores)
    worker_key, worker_admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    worker_env = {API_KEY_ENV: worker_key, ADMIN_API_KEY_ENV: worker_admin_key}
    if server_args.hicache_storage_key:  # a secret too: the environment, not the command line
        worker_env[STORAGE_KEY_ENV] = server_args.hicache_storage_key
    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    skip = {
        "host",
        "port",
        "api_key",
        "admin_api_key",
        "hicache_storage_key",
        "allowed_origins",
        "dp_size",
        "num_threads",
        "log_level",
    }
    options = {
        k: v
        for k, v in dataclasses.asdict(server_args).items()
        if k not in skip and v != defaults.get(k)
    }
    workers: list[ServerProcess] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for k, share in enumerate(shares):
            # With --tp-size each server's ranks split its share (num_threads is per rank).
            threads = server_args.num_threads or max(1, len(share) // server_args.tp_size)
            if server_args.kv_events_config:  # each server publishes on ports of its own
                options["kv_events_config"] = kv_events_for_rank(server_args.kv_events_config, k)
            argv = ServerArgs.to_cli_argv(**options, num_threads=threads)
            workers.append(ServerProcess(*argv, cpus=share, name=f"dp worker {k}", env=worker_env))
            print(
                f"radixlm dp worker {k}: {workers[-1].url} on cores {share}, {threads} thread(s)",
                flush=True,
            )
        print(
            f"radixlm router on http://{server_args.host}:{server_args.port} in front of {n}"
            " servers",
            flush=True,
        )
        run_router(
            RouterArgs(
                worker_urls=[w.url for w in workers],
                host=server_args.host,
                port=server_args.port,
                api_key=server_args.api_key,
                worker_api_key=worker_key,
                admin_api_key=server_args.admin_api_key,
                worker_admin_api_key=worker_admin_key,
                allowed_origins=origins,
                max_request_body_bytes=server_args.max_request_body_bytes,
                log_level=server_args.log_level,
            )
        )
    finally:
        for w in workers:
            w.stop()
