"""The fleet soak (`benchmarks/soak.py --fleet`, docs/reliability.md "Fleet under chaos"): a
Mooncake master, two radixlm workers sharing it as their L3 (with the watchdog and
--restart-on-failure), and SGLang's gateway (sglang-router, cache-aware) over them; the soak's load
(and, with --hostile, its attackers) goes through the gateway while chaos.py freezes worker 1's
scheduler and later kills the master.

The gateway serves its own /health and /get_server_info and no /tokenize, so the soak's server
steps (the pool and context, /tokenize, the drain and leak checks, /flush_cache, /health) go to
each worker directly (runner.soak's `servers`); the load and the greedy replay go through the
gateway."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
import time

from radixlm.bench.soak.chaos import ChaosConfig, ChaosLoad
from radixlm.bench.soak.config import SoakConfig
from radixlm.bench.soak.hostile import HostileConfig, HostileLoad
from radixlm.bench.soak.runner import soak

# What the gateway itself answers a batch of texts on /generate (its request type takes one text).
GATEWAY_BATCH_REFUSAL = 422
# The gateway's Prometheus series kept as figures: its retries, per-worker errors and routing.
GATEWAY_SERIES = (
    "smg_worker_retries_total",
    "smg_worker_retries_exhausted_total",
    "smg_worker_errors_total",
    "smg_worker_selection_total",
    "smg_router_upstream_responses_total",
)


@dataclasses.dataclass
class FleetConfig:
    server_args: list[str]  # each worker's `radixlm serve` arguments
    watchdog_timeout: float = 10.0
    # The frozen worker comes back (and its /health turns 200 again) instead of exiting.
    restart_on_failure: bool = True
    freeze_at: float = 20.0  # seconds into the load
    kill_master_at: float = 40.0
    policy: str = "cache_aware"
    storage_key: str = "radixlm-fleet-soak-storage-key"  # the workers' shared chunk MAC key
    start_timeout: float = 600.0


class Fleet:
    """The master, the two workers and the gateway, started; stop() ends them all."""

    def __init__(self, cfg: FleetConfig, log=print):
        from radixlm.bench.mooncake_master import MooncakeMaster
        from radixlm.server.process import ServerProcess

        self.cfg = cfg
        self.dir = tempfile.mkdtemp(prefix="radixlm-fleet-")
        self.master = MooncakeMaster()
        self.workers: list = []
        self.gateway = None
        self.prometheus_port = None
        try:
            for i in range(2):
                args = [
                    *cfg.server_args,
                    "--enable-hierarchical-cache",
                    "--hicache-storage-backend",
                    "mooncake",
                    "--watchdog-timeout",
                    str(cfg.watchdog_timeout),
                    "--crash-dump-folder",
                    self.dump_dir(i),
                    *(["--restart-on-failure"] if cfg.restart_on_failure else []),
                ]
                self.workers.append(
                    ServerProcess(
                        *args,
                        timeout=cfg.start_timeout,
                        env=self.master.env(cfg.storage_key),
                        name=f"worker {i}",
                    )
                )
                log(f"worker {i} at {self.workers[-1].url}")
            self.gateway = ServerProcess(command=self._gateway_command, name="sglang-router")
            self._wait_gateway_sees_workers()
            log(f"gateway at {self.gateway.url}")
        except BaseException:
            self.stop()
            raise

    def dump_dir(self, i: int) -> str:
        return os.path.join(self.dir, f"crash-dumps-{i}")

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def _gateway_command(self, port: int) -> list[str]:
        from radixlm.server.process import free_port

        self.prometheus_port = free_port()
        return [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *self.worker_urls,
            "--policy",
            self.cfg.policy,
            "--prometheus-port",
            str(self.prometheus_port),
            # its own health check every second; one failure marks a worker unhealthy
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            # its circuit breaker opens on a worker's 10 failures (the frozen worker's 503s) for
            # 60 s by default, keeping the restarted worker out long after its health check
            # passes; the health check already takes a dead worker out
            "--cb-timeout-duration-secs",
            "5",
            "--log-level",
            "warn",
        ]

    def _wait_gateway_sees_workers(self, timeout: float = 60) -> None:
        """The gateway's /health is its own: wait until it lists both workers healthy."""
        import requests

        deadline = time.time() + timeout
        while time.time() < deadline:
            listed = requests.get(self.gateway.url + "/workers", timeout=5).json()["workers"]
            if sum(w["is_healthy"] for w in listed) == len(self.workers):
                return
            time.sleep(0.3)
        raise TimeoutError(f"the gateway did not list the workers healthy in {timeout:.0f} s")

    def gateway_metrics(self) -> dict[str, float]:
        """GATEWAY_SERIES' samples (series with labels -> value); empty when unreadable."""
        import requests

        try:
            text = requests.get(f"http://127.0.0.1:{self.prometheus_port}/metrics", timeout=10).text
        except requests.RequestException:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith(GATEWAY_SERIES):
                series, _, value = line.rpartition(" ")
                out[series] = float(value)
        return out

    def worker_stats(self) -> dict[str, dict]:
        """Each worker's engine restarts and, since its engine started (the frozen one's: since
        its restart), the tokens it generated and its L3 counters: shared chunks read and
        written, and the store's failures."""
        import requests

        keys = ("l3_hit_tokens", "l3_chunks_written", "read_errors", "write_errors")
        out = {}
        for i, url in enumerate(self.worker_urls):
            try:
                info = requests.get(url + "/get_server_info", timeout=30).json()
                state = info["internal_state"]
                out[f"worker {i}"] = {
                    "engine_restarts": info["engine_restarts"],
                    "generated_tokens": state["generated_tokens"],
                    **{k: state["hicache"].get(k) for k in keys},
                }
            except (requests.RequestException, ValueError, KeyError) as e:
                out[f"worker {i}"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        return out

    def alive(self) -> dict[str, bool]:
        procs = {f"worker {i}": w.proc for i, w in enumerate(self.workers)}
        procs["gateway"] = self.gateway.proc
        return {k: p.poll() is None for k, p in procs.items()}

    def stop(self) -> dict[str, int | None]:
        codes = {}
        if self.gateway is not None:
            codes["gateway"] = self.gateway.stop()
        for i, w in enumerate(self.workers):
            codes[f"worker {i}"] = w.stop()
        self.master.kill()
        return codes


def run_fleet(
    cfg: SoakConfig, fleet_cfg: FleetConfig, hostile: HostileConfig | None = None, log=print
) -> dict:
    """The soak through the gateway of a fleet started here, with the chaos (and the hostile load
    when given) alongside; the summary adds "chaos", "fleet" and their checks."""
    fleet = Fleet(fleet_cfg, log)
    try:
        chaos = ChaosLoad(
            ChaosConfig(
                worker_urls=fleet.worker_urls,
                dump_dir=fleet.dump_dir(1),
                watchdog_timeout=fleet_cfg.watchdog_timeout,
                restart=fleet_cfg.restart_on_failure,
                freeze_at=fleet_cfg.freeze_at,
                kill_master_at=fleet_cfg.kill_master_at,
                gateway_url=fleet.gateway.url,
            ),
            kill_master=fleet.master.kill,
        )
        side: list = [chaos]
        if hostile is not None:
            hostile = dataclasses.replace(
                hostile,
                server_url=fleet.worker_urls[0],
                also_expected={"fanout": {GATEWAY_BATCH_REFUSAL}},
            )
            side.append(HostileLoad(hostile))
        summary = asyncio.run(
            soak(fleet.gateway.url, cfg, log=log, side=side, servers=fleet.worker_urls)
        )
        alive = fleet.alive()
        gateway_metrics, stats = fleet.gateway_metrics(), fleet.worker_stats()
    except BaseException:
        for name, p in (("gateway", fleet.gateway), ("worker 0", fleet.workers[0])):
            print(f"{name} log (tail):\n{p.output()[-3000:]}", file=sys.stderr)
        fleet.stop()
        raise
    codes = fleet.stop()
    summary["fleet"] = {
        "workers": fleet.worker_urls,
        "alive_at_end": alive,
        "exit_codes": codes,
        "dumps": fleet.dir,
        "gateway_metrics": gateway_metrics,
        "worker_stats": stats,
    }
    summary["checks"]["fleet_alive"] = all(alive.values())
    # the frozen worker's engine restarted once (or, without restarts, exited); the other never
    # did: a watchdog timeout under the longest loop step would restart it
    summary["checks"]["fleet_restarts"] = stats["worker 0"].get("engine_restarts") == 0 and (
        stats["worker 1"].get("engine_restarts") == 1 if fleet_cfg.restart_on_failure else True
    )
    summary["ok"] = all(summary["checks"].values())
    if not summary["ok"]:
        summary["server_log_tail"] = "\n".join(
            f"--- worker {i}:\n{w.output()[-3000:]}" for i, w in enumerate(fleet.workers)
        )
    return summary
