"""`radixlm serve`: start the engine processes, then the HTTP server on this process; watch the
engine and, when one of its processes dies or hangs (--watchdog-timeout), exit non-zero or
(--restart-on-failure) start a new engine. See docs/architecture.md, "Processes", and
docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from radixlm.config import PortArgs, ServerArgs
from radixlm.engine.launcher import check_server_args

logger = logging.getLogger(__name__)


class EngineSupervisor:
    """Owns the engine's child processes for the HTTP server: starts them, swaps in a new engine
    after a failure (--restart-on-failure) or asks the server to exit with code 1."""

    def __init__(self, server_args: ServerArgs, tokenizer, uvicorn_server):
        self.server_args = server_args
        self.tokenizer = tokenizer
        self.uvicorn_server = uvicorn_server
        self.procs: list = []
        self.port_args: PortArgs | None = None
        self.info: dict = {}
        self.state = None  # the ServerState, once the app started
        self.stopping = False
        self.exit_code = 0
        from radixlm.engine.observability import Observability

        self.observability = Observability.from_server_args(
            server_args
        )  # shared by the engines it restarts

    def launch(self, fork_ok: bool = False) -> dict:
        """fork_ok: the first launch, while this process is still one thread (a restart is not)."""
        from radixlm.engine.launcher import launch_engine_processes

        self.procs, self.port_args, info = launch_engine_processes(
            self.server_args, fork_ok, self.tokenizer
        )
        self.info = {**info, "detokenizer_pid": self.procs[1].pid}
        return self.info

    async def attach(self):
        """A TokenizerManager on this loop for the current engine, watched."""
        from radixlm.engine.launcher import watch_processes
        from radixlm.engine.tokenizer_manager import TokenizerManager
        from radixlm.engine.tokenizer_manager_config import TokenizerManagerConfig

        tm = TokenizerManager(
            TokenizerManagerConfig.from_server_args(self.server_args),
            self.port_args,
            self.tokenizer,
            self.info,
            self.observability,
        )
        await tm.start()
        loop = asyncio.get_running_loop()
        procs = self.procs
        watch_processes(
            procs,
            lambda msg: loop.call_soon_threadsafe(self._on_dead, tm, msg),
            lambda: self.stopping or procs is not self.procs,
            self.server_args.watchdog_interval,
            tm,
            self.server_args.watchdog_timeout,
        )
        return tm

    def _on_dead(self, tm, message: str) -> None:
        tm.mark_dead(message)  # in-flight requests fail with a 503 now; /health answers 503
        if self.stopping:
            return
        if self.server_args.restart_on_failure:
            logger.error("%s; restarting the engine (--restart-on-failure)", message)
            asyncio.get_running_loop().create_task(self._restart(tm))
        else:
            print(
                f"radixlm: error: {message}; the server exits in"
                f" {self.server_args.engine_failure_exit_delay:g} s (--restart-on-failure restarts"
                " the engine instead)",
                file=sys.stderr,
                flush=True,
            )
            asyncio.get_running_loop().call_later(
                self.server_args.engine_failure_exit_delay, self.shutdown, 1
            )

    async def _restart(self, old_tm) -> None:
        from radixlm.engine.launcher import stop_processes

        old_procs, old_ports = self.procs, self.port_args
        await asyncio.to_thread(stop_processes, old_procs, old_ports)
        try:
            await asyncio.to_thread(self.launch)
        except Exception as e:
            print(f"radixlm: error: the engine did not restart: {e}", file=sys.stderr, flush=True)
            self.shutdown(1)
            return
        tm = await self.attach()
        st = self.state
        st.tokenizer_manager, st.scheduler_info = tm, self.info
        st.engine_restarts += 1
        if st.metrics is not None:
            st.metrics.tm = tm
        await old_tm.close()
        logger.warning("engine restarted (%d restart(s) so far)", st.engine_restarts)

    def shutdown(self, code: int) -> None:
        self.exit_code = max(self.exit_code, code)
        self.uvicorn_server.should_exit = True

    def stop(self) -> None:
        from radixlm.engine.launcher import stop_processes

        self.stopping = True
        stop_processes(self.procs, self.port_args)


def launch_server(server_args: ServerArgs) -> None:
    import uvicorn

    from radixlm.engine.chat_templates import apply_chat_template_option
    from radixlm.http_access import AccessConfig, install_access, parse_origins
    from radixlm.model.loader import default_model_path, load_tokenizer
    from radixlm.reasoning import detect_reasoning_parser
    from radixlm.server.api_common import ServerState, served_model_name
    from radixlm.server.fim import fim_tokens
    from radixlm.server.http_server import create_app
    from radixlm.server.tool_template import agent_setup_line
    from radixlm.utils import configure_logging

    configure_logging(server_args.log_level)
    check_server_args(server_args)  # a bad option: one error before anything loads
    access = AccessConfig(
        server_args.api_key,
        server_args.admin_api_key,
        server_args.host,
        parse_origins(server_args.allowed_origins),
    )
    tokenizer = load_tokenizer(
        server_args.tokenizer_path or server_args.model_path or default_model_path()
    )
    # The templates are checked here, before the model loads: a bad one is one error line.
    apply_chat_template_option(tokenizer, server_args.chat_template)
    fim_tokens(tokenizer, server_args.completion_template)
    if server_args.reasoning_parser is None:  # a harmony template: gpt-oss's channels, unasked
        server_args.reasoning_parser = detect_reasoning_parser(tokenizer.chat_template)
    tools_line = agent_setup_line(
        tokenizer, server_args
    )  # before the model loads: a bad parser is one error

    async def state_factory() -> ServerState:
        tm = await supervisor.attach()
        metrics = None
        if server_args.enable_metrics:
            from radixlm.server.metrics import ServerMetrics

            metrics = ServerMetrics(tm, served_model_name(server_args, supervisor.info))
        supervisor.state = ServerState(server_args, tm, supervisor.info, metrics)
        return supervisor.state

    app = create_app(state_factory)
    install_access(app, access)
    if server_args.enable_metrics:
        from radixlm.server.metrics import mount_metrics

        mount_metrics(app)
    # uvicorn drains in-flight requests on SIGTERM for up to --graceful-shutdown-timeout (it stops
    # accepting connections at once), then cancels what is left, which aborts those requests.
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=server_args.host,
            port=server_args.port,
            log_level="warning",
            timeout_graceful_shutdown=server_args.graceful_shutdown_timeout,
        )
    )
    supervisor = EngineSupervisor(server_args, tokenizer, server)
    info = supervisor.launch(fork_ok=True)
    url = f"http://{server_args.host}:{server_args.port}"
    auth = (
        " -H 'Authorization: Bearer <api key>'" if server_args.api_key else ""
    )  # keys are printed nowhere
    print(
        f"radixlm serving {served_model_name(server_args, info)} at {url}\n  KV cache:"
        f" {info['max_total_num_tokens']} tokens ({info['kv_cache_bytes'] / 2**20:.0f} MiB),"
        f" context {info['context_len']}\n  try: curl {url}/generate{auth} -H 'Content-Type:"
        ' application/json\' -d \'{"text": "The capital of France is", "sampling_params":'
        f' {{"max_new_tokens": 16, "temperature": 0}}}}\'\n  OpenAI API: {url}/v1\n '
        f" {tools_line}",
        flush=True,
    )
    # uvicorn re-raises SIGTERM after its shutdown with the previous handler: make that an exit
    # that runs the `finally` below (the default handler would skip it, leaving the ipc socket dir).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        server.run()
    finally:
        supervisor.stop()
    if supervisor.exit_code:
        sys.exit(supervisor.exit_code)
