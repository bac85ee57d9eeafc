"""`radixlm router`: the router's flags (SGLang router's names) and its uvicorn server."""

from __future__ import annotations

import argparse
import logging

from radixlm.router.policies import POLICIES, CacheAwareConfig
from radixlm.router.server import RouterArgs, create_router_app
from radixlm.router.workers import HealthConfig


def add_router_args(p: argparse.ArgumentParser) -> None:
    d, c, h = RouterArgs(), CacheAwareConfig(), HealthConfig()
    p.add_argument("--worker-urls", nargs="*", default=[], help="the radixlm servers behind the router")
    p.add_argument("--policy", choices=POLICIES, default=d.policy)
    p.add_argument("--host", default=d.host, help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--api-key", default=None, help="clients must send Authorization: Bearer <key>")
    p.add_argument("--worker-api-key", default=None, help="the key the workers require, sent to them")
    p.add_argument("--cache-threshold", type=float, default=c.cache_threshold,
                   help="share of a request's text cached on a worker for cache_aware to follow it")
    p.add_argument("--balance-abs-threshold", type=int, default=c.balance_abs_threshold,
                   help="in-flight difference (max - min) above which the least loaded worker is taken ...")
    p.add_argument("--balance-rel-threshold", type=float, default=c.balance_rel_threshold,
                   help="... when max is also above min times this")
    p.add_argument("--eviction-interval-secs", type=float, default=c.eviction_interval_secs)
    p.add_argument("--max-tree-size", type=int, default=c.max_tree_size, help="characters per worker in the tree")
    p.add_argument("--health-check-interval-secs", type=float, default=h.interval)
    p.add_argument("--health-check-timeout-secs", type=float, default=h.timeout)
    p.add_argument("--health-failure-threshold", type=int, default=h.failure_threshold)
    p.add_argument("--health-success-threshold", type=int, default=h.success_threshold)
    p.add_argument("--max-retries", type=int, default=d.max_retries)
    p.add_argument("--retry-backoff-secs", type=float, default=d.retry_backoff)
    p.add_argument("--log-level", default=d.log_level)


def router_args_from_cli(a: argparse.Namespace) -> RouterArgs:
    return RouterArgs(
        worker_urls=list(a.worker_urls), policy=a.policy, host=a.host, port=a.port, api_key=a.api_key,
        worker_api_key=a.worker_api_key,
        cache_aware=CacheAwareConfig(a.cache_threshold, a.balance_abs_threshold, a.balance_rel_threshold,
                                     a.eviction_interval_secs, a.max_tree_size),
        health=HealthConfig(a.health_check_interval_secs, a.health_check_timeout_secs, a.health_failure_threshold,
                            a.health_success_threshold),
        max_retries=a.max_retries, retry_backoff=a.retry_backoff_secs, log_level=a.log_level)


def run_router(args: RouterArgs) -> None:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s router] %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    app = create_router_app(args)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_keep_alive=30)
