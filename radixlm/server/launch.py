"""`radixlm serve`: start the engine processes, then the HTTP server on this process."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from radixlm.config import ServerArgs

logger = logging.getLogger(__name__)


def launch_server(server_args: ServerArgs) -> None:
    import uvicorn

    from radixlm.engine.launcher import launch_engine_processes, stop_processes, watch_processes
    from radixlm.engine.tokenizer_manager import TokenizerManager
    from radixlm.model.loader import default_model_path, load_tokenizer
    from radixlm.server.http_server import ServerState, create_app, served_model_name
    from radixlm.utils import configure_logging

    configure_logging(server_args.log_level)
    tokenizer = load_tokenizer(server_args.tokenizer_path or server_args.model_path or default_model_path())
    procs, port_args, info = launch_engine_processes(server_args)
    stopping = False

    async def state_factory() -> ServerState:
        tm = TokenizerManager(server_args, port_args, tokenizer, info)
        await tm.start()
        loop = asyncio.get_running_loop()
        watch_processes(
            procs, lambda msg: loop.call_soon_threadsafe(tm.mark_dead, msg), lambda: stopping,
            server_args.watchdog_interval,
        )
        metrics = None
        if server_args.enable_metrics:
            from radixlm.server.metrics import ServerMetrics

            metrics = ServerMetrics(tm)
        return ServerState(server_args, tm, info, metrics)

    app = create_app(state_factory)
    app.state.api_key = server_args.api_key
    if server_args.enable_metrics:
        from radixlm.server.metrics import mount_metrics

        mount_metrics(app)
    url = f"http://{server_args.host}:{server_args.port}"
    auth = f" -H 'Authorization: Bearer {server_args.api_key}'" if server_args.api_key else ""
    print(
        f"radixlm serving {served_model_name(server_args, info)} at {url}\n"
        f"  KV cache: {info['max_total_num_tokens']} tokens ({info['kv_cache_bytes'] / 2**20:.0f} MiB), "
        f"context {info['context_len']}\n"
        f"  try: curl {url}/generate{auth} -H 'Content-Type: application/json' "
        "-d '{\"text\": \"The capital of France is\", \"sampling_params\": {\"max_new_tokens\": 16, \"temperature\": 0}}'\n"
        f"  OpenAI API: {url}/v1",
        flush=True,
    )
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it with the previous handler: make
    # that an exit that runs the `finally` below (the default handler would skip it, leaving the
    # ipc socket dir behind).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        uvicorn.run(app, host=server_args.host, port=server_args.port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        stopping = True
        stop_processes(procs, port_args)
