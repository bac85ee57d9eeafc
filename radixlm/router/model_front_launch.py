"""`radixlm serve` with several models: its flags (llama-server's router names: --models-dir,
--models-max; and --model-load-timeout), each model's child command, and the front's server.

The children get the engine flags the user gave (every ServerArgs option but the front's own:
address, keys, browser origins, the model and its name), listen on loopback ports, and require
keys of their own, handed to them in the environment (never on a command line)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import secrets
import signal
import sys

from radixlm.config import ServerArgs
from radixlm.http_access import ADMIN_API_KEY_ENV, API_KEY_ENV, AccessConfig, parse_origins
from radixlm.router.model_catalog import ModelSpec, catalog
from radixlm.router.model_child import ModelChild, free_port

MODELS_MAX_DEFAULT = 4  # llama-server's --models-max default
MODEL_LOAD_TIMEOUT_DEFAULT = 300.0  # seconds: a model of tens of GB from a slow disk

# The front's own options: not passed to the children.
FRONT_OPTIONS = {
    "model_path",
    "served_model_name",
    "host",
    "port",
    "api_key",
    "admin_api_key",
    "allowed_origins",
    "hicache_storage_key",
}


class ModelPathAction(argparse._StoreAction):
    """--model-path (and --model): the last one is `model_path`, as always; all of them, in
    order, are `model_paths` (several: many models behind one server). A store action still (what
    SGLang's --config merger accepts for a scalar option)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.model_paths = [*(getattr(namespace, "model_paths", None) or []), values]


def add_multi_model_args(p: argparse.ArgumentParser) -> None:
    p.set_defaults(model_paths=None)
    p.add_argument(
        "--models-dir",
        default=None,
        help=(
            "serve every GGUF file and HF model directory in this directory, each by its name"
            " (file stem or directory name), loaded on first use"
        ),
    )
    p.add_argument(
        "--models-max",
        type=int,
        default=MODELS_MAX_DEFAULT,
        help=(
            "with several models: at most this many loaded at once; beyond it the least recently"
            " used idle one unloads"
        ),
    )
    p.add_argument(
        "--model-load-timeout",
        type=float,
        default=MODEL_LOAD_TIMEOUT_DEFAULT,
        help=(
            "with several models: seconds a model may take to load, and a request may wait for"
            " its model (503 after)"
        ),
    )


def is_multi_model(args: argparse.Namespace) -> bool:
    return bool(args.models_dir) or len(set(args.model_paths or [])) > 1


def model_specs(args: argparse.Namespace) -> dict[str, ModelSpec]:
    paths = list(dict.fromkeys(args.model_paths or []))  # each once, in order
    return catalog(paths, args.models_dir)


def check_front_args(server_args: ServerArgs) -> None:
    if server_args.served_model_name:
        raise ValueError(
            "served_model_name: with several models each is served by its own name (file stem or"
            " directory name); leave --served-model-name out"
        )


def child_flags(server_args: ServerArgs) -> list[str]:
    """The engine flags every child gets: those given that differ from the defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    options = {
        k: v
        for k, v in dataclasses.asdict(server_args).items()
        if k not in FRONT_OPTIONS and v != defaults.get(k)
    }
    return ServerArgs.to_cli_argv(**options)


def run_model_front(
    server_args: ServerArgs,
    specs: dict[str, ModelSpec],
    models_max: int,
    load_timeout: float,
    secrets_env: dict[str, str],
) -> None:
    """secrets_env: what the children get in their environment besides their keys (a secret
    option of theirs, e.g. the L3 storage key)."""
    import uvicorn

    from radixlm.router.model_front import FrontArgs, create_model_front_app
    from radixlm.router.model_pool import ModelPool
    from radixlm.utils import configure_logging

    configure_logging(server_args.log_level, "models")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per proxied request otherwise
    check_front_args(server_args)
    flags = child_flags(server_args)
    child_key, child_admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    env = {**secrets_env, API_KEY_ENV: child_key, ADMIN_API_KEY_ENV: child_admin_key}

    def make_child(spec: ModelSpec) -> ModelChild:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "radixlm.cli",
            "serve",
            "--model-path",
            spec.path,
            "--served-model-name",
            spec.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *flags,
        ]
        return ModelChild(spec.name, argv, env, port)

    pool = ModelPool(specs, make_child, models_max, load_timeout)
    access = AccessConfig(
        server_args.api_key,
        server_args.admin_api_key,
        server_args.host,
        parse_origins(server_args.allowed_origins),
    )
    app = create_model_front_app(
        pool,
        FrontArgs(access, child_key, child_admin_key, server_args.max_request_body_bytes),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=server_args.host,
            port=server_args.port,
            log_level="warning",
            timeout_graceful_shutdown=server_args.graceful_shutdown_timeout,
        )
    )
    logging.getLogger(__name__).info(
        "engine flags for every model: %s", " ".join(flags) or "(the defaults)"
    )
    print(
        f"radixlm serving {len(specs)} models at http://{server_args.host}:{server_args.port},"
        f" each loaded on first use (--models-max {models_max}):\n  "
        + "\n  ".join(f"{s.name}: {s.path}" for s in specs.values()),
        flush=True,
    )
    # uvicorn re-raises SIGTERM after its shutdown (which stopped every child): an exit that runs
    # the `finally` below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        server.run()
    finally:
        pool.kill_all()  # whatever a shutdown cut short
