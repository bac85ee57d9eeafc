"""`radixlm router`: the router's flags (SGLang router's names) and its uvicorn server."""

from __future__ import annotations

import argparse
import logging

from radixlm.http_access import ADMIN_API_KEY_ENV, API_KEY_ENV, key_from_env, parse_origins
from radixlm.router.policies import ROUTER_POLICY_REGISTRY, CacheAwareConfig
from radixlm.router.server import create_router_app
from radixlm.router.state import RouterArgs
from radixlm.router.workers import HealthConfig

WORKER_API_KEY_ENV = "RADIXLM_WORKER_API_KEY"
WORKER_ADMIN_API_KEY_ENV = "RADIXLM_WORKER_ADMIN_API_KEY"


def add_router_args(p: argparse.ArgumentParser) -> None:
    d, c, h = RouterArgs(), CacheAwareConfig(), HealthConfig()
    p.add_argument(
        "--worker-urls", nargs="*", default=[], help="the radixlm servers behind the router"
    )
    p.add_argument("--policy", choices=ROUTER_POLICY_REGISTRY.names(), default=d.policy)
    p.add_argument("--host", default=d.host, help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument(
        "--api-key",
        default=None,
        help=f"clients must send Authorization: Bearer <key>; default ${API_KEY_ENV}",
    )
    p.add_argument(
        "--worker-api-key",
        default=None,
        help=(
            "the key the workers require, sent to verified workers only; default"
            f" ${WORKER_API_KEY_ENV}"
        ),
    )
    p.add_argument(
        "--admin-api-key",
        default=None,
        help=(
            "the operator's key for /add_worker, /remove_worker, /flush_cache and aborting every"
            f" request (also accepted wherever --api-key is); default ${ADMIN_API_KEY_ENV}. Without"
            " it those are refused, except with no key at all on a loopback address"
        ),
    )
    p.add_argument(
        "--worker-admin-api-key",
        default=None,
        help=(
            "the workers' admin key, sent with admin actions only; default"
            f" ${WORKER_ADMIN_API_KEY_ENV}"
        ),
    )
    p.add_argument(
        "--allowed-origins",
        default=None,
        help=(
            'browser origins (comma-separated, or a JSON list; "*": any) whose pages may call the '
            "router; other cross-origin browser requests are refused with 403"
        ),
    )
    p.add_argument(
        "--worker-allowlist",
        nargs="*",
        default=[],
        help=(
            "host patterns (fnmatch, e.g. '10.0.*' '*.internal' 'gpu-?:30000') that worker URLs"
            " must match (--worker-urls and /add_worker: 403); default any host"
        ),
    )
    p.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=d.max_request_body_bytes,
        help="larger request bodies are refused with 413",
    )
    p.add_argument(
        "--connect-timeout-secs",
        type=float,
        default=d.connect_timeout,
        help="seconds to connect to a worker before trying another",
    )
    p.add_argument(
        "--request-timeout-secs",
        type=float,
        default=d.request_timeout,
        help="seconds a worker may send nothing on a request before it fails",
    )
    p.add_argument(
        "--cache-threshold",
        type=float,
        default=c.cache_threshold,
        help="share of a request's text cached on a worker for cache_aware to follow it",
    )
    p.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=c.balance_abs_threshold,
        help="in-flight difference (max - min) above which the least loaded worker is taken ...",
    )
    p.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=c.balance_rel_threshold,
        help="... when max is also above min times this",
    )
    p.add_argument(
        "--kv-events",
        action="store_true",
        help=(
            "cache_aware routes on the workers' KV events (their --kv-events-config publishers,"
            " found through /get_server_info) instead of guessing; workers without events are"
            " still routed on the text tree"
        ),
    )
    p.add_argument("--eviction-interval-secs", type=float, default=c.eviction_interval_secs)
    p.add_argument(
        "--max-tree-size",
        type=int,
        default=c.max_tree_size,
        help="characters per worker in the tree",
    )
    p.add_argument("--health-check-interval-secs", type=float, default=h.interval)
    p.add_argument("--health-check-timeout-secs", type=float, default=h.timeout)
    p.add_argument("--health-failure-threshold", type=int, default=h.failure_threshold)
    p.add_argument("--health-success-threshold", type=int, default=h.success_threshold)
    p.add_argument("--max-retries", type=int, default=d.max_retries)
    p.add_argument("--retry-backoff-secs", type=float, default=d.retry_backoff)
    p.add_argument("--log-level", default=d.log_level)
    # PD disaggregation (SGLang router's flags; docs/disaggregation.md).
    p.add_argument(
        "--pd-disaggregation",
        action="store_true",
        help="route each request to a prefill and a decode server (--prefill, --decode)",
    )
    p.add_argument(
        "--prefill",
        nargs="+",
        action="append",
        default=[],
        metavar=("URL", "BOOTSTRAP_PORT"),
        help="a prefill server and its bootstrap port (default 8998); repeatable",
    )
    p.add_argument(
        "--decode", action="append", default=[], metavar="URL", help="a decode server; repeatable"
    )
    p.add_argument(
        "--prefill-policy",
        choices=ROUTER_POLICY_REGISTRY.names(),
        default=None,
        help="picks the prefill server (default --policy)",
    )
    p.add_argument(
        "--decode-policy",
        choices=ROUTER_POLICY_REGISTRY.names(),
        default=None,
        help="picks the decode server (default --policy)",
    )


def router_args_from_cli(a: argparse.Namespace) -> RouterArgs:
    return RouterArgs(
        worker_urls=list(a.worker_urls),
        policy=a.policy,
        host=a.host,
        port=a.port,
        api_key=key_from_env(a.api_key, API_KEY_ENV),
        worker_api_key=key_from_env(a.worker_api_key, WORKER_API_KEY_ENV),
        admin_api_key=key_from_env(a.admin_api_key, ADMIN_API_KEY_ENV),
        worker_admin_api_key=key_from_env(a.worker_admin_api_key, WORKER_ADMIN_API_KEY_ENV),
        allowed_origins=parse_origins(a.allowed_origins),
        worker_allowlist=tuple(a.worker_allowlist),
        max_request_body_bytes=a.max_request_body_bytes,
        connect_timeout=a.connect_timeout_secs,
        request_timeout=a.request_timeout_secs,
        cache_aware=CacheAwareConfig(
            a.cache_threshold,
            a.balance_abs_threshold,
            a.balance_rel_threshold,
            a.eviction_interval_secs,
            a.max_tree_size,
        ),
        kv_events=_kv_events_arg(a),
        health=HealthConfig(
            a.health_check_interval_secs,
            a.health_check_timeout_secs,
            a.health_failure_threshold,
            a.health_success_threshold,
        ),
        max_retries=a.max_retries,
        retry_backoff=a.retry_backoff_secs,
        log_level=a.log_level,
        pd_disaggregation=a.pd_disaggregation,
        prefill_urls=[_prefill_arg(v) for v in a.prefill],
        decode_urls=list(a.decode),
        prefill_policy=a.prefill_policy,
        decode_policy=a.decode_policy,
    )


def _kv_events_arg(a: argparse.Namespace) -> bool:
    if a.kv_events and (a.policy != "cache_aware" or a.pd_disaggregation):
        raise SystemExit("--kv-events needs --policy cache_aware, without --pd-disaggregation")
    return a.kv_events


def _prefill_arg(values: list[str]) -> tuple[str, int | None]:
    """--prefill URL [BOOTSTRAP_PORT]"""
    if len(values) > 2 or (len(values) == 2 and not values[1].isdigit()):
        raise SystemExit(f"--prefill takes URL [BOOTSTRAP_PORT], got {' '.join(values)}")
    return values[0], int(values[1]) if len(values) == 2 else None


def run_router(args: RouterArgs) -> None:
    import uvicorn

    logging.basicConfig(
        level=args.log_level.upper(),
        format="[%(asctime)s router] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    if args.pd_disaggregation:
        from radixlm.router.pd import create_pd_router_app

        if not args.prefill_urls or not args.decode_urls:
            raise SystemExit(
                "--pd-disaggregation needs at least one --prefill and one --decode server"
            )
        app = create_pd_router_app(args)
    else:
        app = create_router_app(args)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_keep_alive=30)
