"""The fleet soak's chaos (fleet.py, docs/reliability.md "Fleet under chaos"): while the load runs
through the gateway, one worker's scheduler is frozen (SIGSTOP: the process is there, its loop
makes no progress) and later the Mooncake master is killed; each worker's /health is probed
directly, from a process of its own per worker, all along.

Checks (ChaosLoad.summary):
- chaos_done: the freeze and the kill both happened while the load ran;
- lost_within_in_flight: the normal requests that failed (not disconnected, not 200) number no
  more than the requests in flight on the frozen worker, and each failed with that worker's
  watchdog verdict (its message names the frozen scheduler's pid). In flight: the requests the
  frozen worker's crash dump (--crash-dump-folder, written when its watchdog declared the scheduler
  hung, before it failed them) lists as not finished;
- frozen_health_503: the frozen worker's /health answered 200 until the freeze and non-200 within
  watchdog timeout + HEALTH_SLACK seconds of the first request waiting on the frozen scheduler
  (the freeze itself, or the oldest request of the dump when it came later);
- frozen_health_back (with --restart-on-failure): 200 again after the restart, and every probe
  after that 200 (the master's death included);
- other_health_200: the other worker answered every probe 200, the master's death included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import os
import time

# A loaded 2-core machine: the watchdog thread's tick (--watchdog-interval, 0.5 s) and the probe's
# own round trip and interval come on top of the watchdog timeout.
HEALTH_SLACK = 3.0
PROBE_TIMEOUT = 5.0  # a /health slower than this counts as not answered


@dataclasses.dataclass
class ChaosConfig:
    worker_urls: list[str]  # [the one left alone, the one frozen]
    dump_dir: str  # the frozen worker's --crash-dump-folder
    watchdog_timeout: float
    restart: bool  # the workers run --restart-on-failure
    freeze_at: float = 20.0  # seconds after the load starts
    kill_master_at: float = 40.0  # seconds after the load starts, and not before the frozen
    # worker is back (a restart while the master is gone is not this campaign)
    probe_interval: float = 0.25
    gateway_url: str | None = None  # to time when the gateway marks the frozen worker unhealthy


class ChaosLoad:
    """A side load of runner.soak: freezes worker 1, kills the master, probes /health."""

    name = "chaos"

    def __init__(self, cfg: ChaosConfig, kill_master):
        self.cfg = cfg
        self.kill_master = kill_master  # callable: kills the Mooncake master
        self.t_load = self.t_freeze = self.t_kill = self.t_gateway_unhealthy = None
        self.frozen_pid: int | None = None
        self._frozen_proc = None  # its psutil.Process
        self.probes: list[list] = [[] for _ in cfg.worker_urls]  # (sent, received, status)
        self.lost: list[dict] = []
        self.unexplained: list[dict] = []

    async def run(self, url: str, stop: asyncio.Event) -> None:
        import multiprocessing

        import httpx

        self.t_load = time.time()
        ctx = multiprocessing.get_context("spawn")
        halt = ctx.Event()
        pipes = [ctx.Pipe(duplex=False) for _ in self.cfg.worker_urls]
        procs = [
            ctx.Process(target=_probe, args=(u, self.cfg.probe_interval, halt, sink), daemon=True)
            for u, (_, sink) in zip(self.cfg.worker_urls, pipes, strict=True)
        ]
        for p in procs:
            p.start()
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
                await self._chaos(client, stop)
        finally:
            await stop.wait()
            halt.set()
            for i, (results, _) in enumerate(pipes):
                if await asyncio.to_thread(results.poll, 60):
                    self.probes[i] = results.recv()
            for p in procs:
                await asyncio.to_thread(p.join, 30)
            self._release_frozen()

    def _release_frozen(self) -> None:
        """The watchdog killed the frozen scheduler; if it did not, kill it now (the very process
        frozen, not another one that got its pid since)."""
        import psutil

        if self.frozen_pid is None or self._frozen_proc is None:
            return
        try:
            if self._frozen_proc.is_running():  # compares the start time too
                self._frozen_proc.kill()
        except psutil.Error:
            pass

    async def _chaos(self, client, stop: asyncio.Event) -> None:
        import httpx
        import psutil

        frozen = self.cfg.worker_urls[1]
        if not await _sleep_until(stop, self.t_load + self.cfg.freeze_at):
            return
        self.frozen_pid = (await client.get(frozen + "/get_server_info")).json()["scheduler_pid"]
        self._frozen_proc = psutil.Process(self.frozen_pid)
        self.t_freeze = time.time()
        self._frozen_proc.suspend()  # SIGSTOP
        if self.cfg.gateway_url:
            await self._gateway_marks(client, frozen, stop)
        if not await _sleep_until(stop, self.t_load + self.cfg.kill_master_at):
            return
        while self.cfg.restart and not stop.is_set():  # the frozen worker restarted and back
            try:
                r = await client.get(frozen + "/health")
                if r.status_code == 200 and await self._restarted(client):
                    break
            except (httpx.HTTPError, ValueError):  # a worker mid-restart may not answer: ask again
                pass
            await asyncio.sleep(0.5)
        if stop.is_set():
            return
        self.kill_master()
        self.t_kill = time.time()

    async def _restarted(self, client) -> bool:
        info = (await client.get(self.cfg.worker_urls[1] + "/get_server_info")).json()
        return info.get("engine_restarts", 0) >= 1

    async def _gateway_marks(self, client, frozen: str, stop: asyncio.Event) -> None:
        """When the gateway's own health check marks the frozen worker unhealthy (a figure)."""
        import httpx

        deadline = time.time() + self.cfg.watchdog_timeout + 30
        while not stop.is_set() and time.time() < deadline:
            try:
                listed = (await client.get(self.cfg.gateway_url + "/workers")).json()["workers"]
                if not next(w for w in listed if w["url"] == frozen)["is_healthy"]:
                    self.t_gateway_unhealthy = time.time()
                    return
            except (httpx.HTTPError, ValueError, KeyError, StopIteration):  # a figure: ask again
                pass
            await asyncio.sleep(0.25)

    def excused(self, reqs, results) -> set[int]:
        """The failed normal requests that failed with the frozen worker's watchdog verdict."""
        mark = f"(pid {self.frozen_pid}) hung"
        excused = set()
        for r in results.values():
            if r.disconnected or r.status == 200:
                continue
            row = {"idx": r.idx, "kind": r.kind, "status": r.status, "error": r.error}
            row["started"] = round(r.started - (self.t_freeze or r.started), 2)  # since the freeze
            self.lost.append(row)
            if self.frozen_pid is not None and mark in (r.error or ""):
                excused.add(r.idx)
            else:
                self.unexplained.append(row)
        return excused

    def summary(self) -> dict:
        dump = _crash_dump(self.cfg.dump_dir)
        unfinished = [q for q in (dump or {}).get("requests", []) if not q["finished"]]
        t_wait = None
        if self.t_freeze is not None:
            t_wait = max([self.t_freeze, min((q["created_time"] for q in unfinished), default=0)])
        a, b = self.probes
        before = [p for p in b if self.t_freeze is None or p[1] < self.t_freeze]
        after = [p for p in b if self.t_freeze is not None and p[0] >= self.t_freeze]
        first_bad = next((p for p in after if p[2] != 200), None)
        back = next((p for p in after if first_bad and p[0] > first_bad[1] and p[2] == 200), None)
        since_back = [p for p in after if back and p[0] >= back[0]]
        bound = self.cfg.watchdog_timeout + HEALTH_SLACK
        health_503_s = round(first_bad[1] - t_wait, 2) if first_bad and t_wait else None
        master_dead = [p for p in a if self.t_kill and p[0] >= self.t_kill]
        checks = {
            "chaos_done": self.t_freeze is not None and self.t_kill is not None,
            "lost_within_in_flight": (
                dump is not None and not self.unexplained and len(self.lost) <= len(unfinished)
            ),
            "frozen_health_503": (
                bool(before)
                and all(p[2] == 200 for p in before)
                and health_503_s is not None
                and health_503_s <= bound
            ),
            "other_health_200": bool(master_dead) and all(p[2] == 200 for p in a),
        }
        if self.cfg.restart:
            checks["frozen_health_back"] = bool(since_back) and all(p[2] == 200 for p in since_back)
            checks["frozen_health_back"] &= any(p[0] >= (self.t_kill or 1e99) for p in since_back)

        def rel(t):
            return None if t is None or self.t_load is None else round(t - self.t_load, 2)

        return {
            "checks": checks,
            "freeze_at_s": rel(self.t_freeze),
            "master_killed_at_s": rel(self.t_kill),
            "frozen_scheduler_pid": self.frozen_pid,
            "watchdog_timeout_s": self.cfg.watchdog_timeout,
            "health_bound_s": bound,
            "in_flight_on_frozen": len(unfinished),
            "crash_dump_reason": (dump or {}).get("reason"),
            "first_wait_after_freeze_s": round(t_wait - self.t_freeze, 2) if t_wait else None,
            "frozen_health_503_after_s": health_503_s,
            "frozen_health_503_after_freeze_s": (
                round(first_bad[1] - self.t_freeze, 2) if first_bad else None
            ),
            "gateway_unhealthy_after_freeze_s": (
                round(self.t_gateway_unhealthy - self.t_freeze, 2)
                if self.t_gateway_unhealthy
                else None
            ),
            "frozen_back_after_503_s": round(back[1] - first_bad[1], 2) if back else None,
            "lost": len(self.lost),
            "lost_requests": self.lost[:20],
            "unexplained": self.unexplained[:20],
            "probes": {
                "other": _probe_figures(a),
                "frozen": _probe_figures(b),
                "other_while_master_dead": len(master_dead),
                "frozen_while_master_dead": sum(
                    1 for p in since_back if self.t_kill and p[0] >= self.t_kill
                ),
            },
        }


def _probe_figures(probes: list) -> dict:
    ok = [p[1] - p[0] for p in probes if p[2] == 200]
    return {
        "probes": len(probes),
        "ok": len(ok),
        "max_s": round(max(ok, default=0.0), 3),
        "other": sorted({str(p[2]) for p in probes if p[2] != 200}),
    }


def _crash_dump(folder: str) -> dict | None:
    """The newest crash dump under `folder` (crash_dump.py writes FOLDER/<host>/crash_dump_*)."""
    paths = sorted(glob.glob(os.path.join(folder, "*", "crash_dump_*.json")), key=os.path.getmtime)
    if not paths:
        return None
    with open(paths[0]) as f:  # the first: the freeze's (a later one would be another failure)
        return json.load(f)


async def _sleep_until(stop: asyncio.Event, t: float) -> bool:
    """Wait until wall-clock time t; False when the load ended first."""
    try:
        await asyncio.wait_for(stop.wait(), max(0.0, t - time.time()))
    except TimeoutError:
        return True
    return False


def _probe(url: str, interval: float, halt, sink) -> None:
    """A prober's process: GET url/health every `interval` s until `halt`; sends [(sent, received,
    status code or the error's name)] in wall-clock time."""
    import httpx

    out = []
    with httpx.Client(timeout=PROBE_TIMEOUT) as client:
        while not halt.is_set():
            t0 = time.time()
            try:
                status = client.get(url + "/health").status_code
            except httpx.HTTPError as e:
                status = type(e).__name__
            out.append((t0, time.time(), status))
            halt.wait(interval)
    sink.send(out)
