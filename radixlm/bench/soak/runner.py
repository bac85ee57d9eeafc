"""The soak run: `concurrency` clients send the workload back to back; then the server is drained,
flushed, and the greedy requests answered under load are replayed alone (no disconnects).
run() starts a server first when given no URL."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Sequence

from radixlm.bench.soak.checks import drain
from radixlm.bench.soak.client import SoakResult, run_request
from radixlm.bench.soak.config import SoakConfig
from radixlm.bench.soak.report import AfterLoad, SoakRun, summarize
from radixlm.bench.soak.workload import SoakRequest, build_workload, fit_workload, offered_load


async def soak(
    url: str,
    cfg: SoakConfig,
    log=print,
    proc=None,
    side: Sequence = (),
    servers: Sequence[str] = (),
) -> dict:
    """Run the soak against the server at `url` (`proc`: its process when the caller started it),
    with the `side` loads (e.g. hostile.HostileLoad) running while the normal requests do; returns
    the summary (summary["ok"]: every check passed, the side loads' included).

    `servers`: when `url` is a gateway, the servers behind it: the server's own routes (its pool and
    context in /get_server_info, /tokenize, the drain and leak checks, /flush_cache, /health) go to
    each of them, the load and the replay to `url`. A side load with `excused(reqs, results)` names
    the failed requests its own checks account for (fleet.py: those in flight on a frozen worker);
    the status checks leave those out."""
    import httpx

    servers = list(servers) or [url]

    limits = httpx.Limits(
        max_connections=cfg.concurrency + 8, max_keepalive_connections=cfg.concurrency + 8
    )
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=30.0), limits=limits
    ) as client:
        info = (await client.get(servers[0] + "/get_server_info")).json()
        pool = info["max_total_num_tokens"]
        incremental = bool(info.get("incremental_streaming_output"))
        reqs = build_workload(cfg)
        await fit_workload(client, servers[0], reqs, info["context_len"])
        load = offered_load(reqs, cfg.concurrency)
        log(
            f"soak: {len(reqs)} requests, concurrency {cfg.concurrency}, offered load {load:.0f} KV"
            f" tokens = {load / pool:.1f}x the pool of {pool}"
        )
        stats0 = info["internal_state"]
        stop = asyncio.Event()
        sides = [asyncio.create_task(s.run(url, stop)) for s in side]
        try:
            results, duration = await _load(client, url, reqs, cfg, incremental, log)
        finally:
            stop.set()
            await asyncio.gather(*sides)
        after = await _after_load(client, url, servers, reqs, results, cfg, incremental, log)
        health = None
        for u in dict.fromkeys([url, *servers]):  # each must answer 200; else the first failure
            try:
                health = (await client.get(u + "/health")).status_code
            except httpx.HTTPError:
                health = None
            if health != 200:
                break
    alive = health == 200 and (proc is None or proc.poll() is None)
    excused = set()
    for s in side:
        if hasattr(s, "excused"):
            excused |= s.excused(reqs, results)
    run = SoakRun(cfg, reqs, results, pool, load, stats0, duration, after, health, alive, excused)
    summary = summarize(run)
    for s in side:
        summary[s.name] = s.summary()
        summary["checks"].update({f"{s.name}_{k}": v for k, v in summary[s.name]["checks"].items()})
    summary["ok"] = all(summary["checks"].values())
    return summary


async def _load(
    client, url: str, reqs: list[SoakRequest], cfg: SoakConfig, incremental: bool, log
) -> tuple[dict[int, SoakResult], float]:
    """Every request sent by `concurrency` clients back to back: (results by index, seconds)."""
    queue = list(reversed(reqs))
    results: dict[int, SoakResult] = {}
    t0 = time.perf_counter()
    progress = {"done": 0}

    answered: list[float] = []

    def max_delay() -> float:
        if cfg.disconnect_max_delay is not None:
            return cfg.disconnect_max_delay
        return 1.5 * statistics.median(answered) if len(answered) >= 5 else 8.0

    async def worker():
        while queue:
            req = queue.pop()
            r = results[req.idx] = await run_request(
                client, url, req, cfg, incremental, max_delay=max_delay()
            )
            if r.status == 200:
                answered.append(r.latency)
            progress["done"] += 1
            if progress["done"] % max(1, len(reqs) // 10) == 0:
                log(
                    f"  {progress['done']}/{len(reqs)} requests in {time.perf_counter() - t0:.0f} s"
                )

    await asyncio.gather(*[worker() for _ in range(cfg.concurrency)])
    return results, time.perf_counter() - t0


async def _after_load(
    client,
    url: str,
    servers: list[str],
    reqs: list[SoakRequest],
    results: dict[int, SoakResult],
    cfg: SoakConfig,
    incremental: bool,
    log,
) -> AfterLoad:
    """After the load: drained, flushable; then the quiet run: the greedy requests that were
    answered, one at a time, no disconnects."""
    import httpx

    by_idx = {q.idx: q for q in reqs}
    out = AfterLoad(
        greedy=[
            i
            for i, r in sorted(results.items())
            if by_idx[i].greedy and r.status == 200 and not r.stream_error and r.choices
        ]
    )
    try:
        out.leaks, out.state, out.drain_s = await _drain_all(client, servers, cfg.drain_timeout)
        out.flush_ok = True
        for server in servers:
            flush = await client.post(server + "/flush_cache")
            flushed = (await client.get(server + "/get_server_info")).json()["internal_state"]
            out.flush_ok &= (
                flush.status_code == 200
                and flushed["available_kv_tokens"] == flushed["max_total_num_tokens"]
            )
        if cfg.replay:
            t1 = time.perf_counter()
            for k, i in enumerate(out.greedy):
                quiet = await run_request(
                    client, url, by_idx[i], cfg, incremental, disconnect=False
                )
                if quiet.status != 200 or quiet.outputs() != results[i].outputs():
                    out.mismatches.append(
                        {
                            "idx": i,
                            "kind": by_idx[i].kind,
                            "features": by_idx[i].features(),
                            "load": results[i].outputs(),
                            "quiet": quiet.outputs(),
                            "quiet_status": quiet.status,
                        }
                    )
                if (k + 1) % max(1, len(out.greedy) // 5) == 0:
                    log(f"  replayed {k + 1}/{len(out.greedy)} greedy requests")
            out.replay_s = time.perf_counter() - t1
        out.leaks_end, _, _ = await _drain_all(client, servers, cfg.drain_timeout)
    except (httpx.HTTPError, KeyError, ValueError) as e:  # the server died, or answers 503
        out.post_error = f"{type(e).__name__}: {e}"[:300]
        log(f"the server failed after the load: {out.post_error}")
    return out


async def _drain_all(client, servers: list[str], timeout: float) -> tuple[list[str], dict, float]:
    """drain() on each server: (leaks, each named by its server when there are several; the first
    server's internal_state; seconds waited in all)."""
    leaks, state, waited = [], {}, 0.0
    for server in servers:
        bad, info, s = await drain(client, server, timeout)
        leaks += [f"{server}: {b}" if len(servers) > 1 else b for b in bad]
        state = state or info["internal_state"]
        waited += s
    return leaks, state, waited


def run(
    url: str | None,
    cfg: SoakConfig,
    server_args: list[str] | None = None,
    log=print,
    start_timeout: float = 600,
    side: Sequence = (),
) -> dict:
    """The soak against `url`, or against a server started here with `server_args` (stopped after),
    with the `side` loads alongside."""
    server = None
    if url is None:
        from radixlm.server.process import ServerProcess

        server = ServerProcess(*(server_args or []), timeout=start_timeout)
        url = server.url
    try:
        summary = asyncio.run(
            soak(url, cfg, log=log, proc=server.proc if server else None, side=side)
        )
    except BaseException:
        if server is not None:
            print("server log (tail):\n" + server.output()[-4000:], file=sys.stderr)
        raise
    finally:
        if server is not None:
            alive = server.proc.poll() is None
            code = server.stop()
            tail = server.output()[-4000:]
    if server is not None:
        summary["server_exit_code"] = code
        summary["server_alive_at_end"] = alive
        if not summary["ok"]:
            summary["server_log_tail"] = tail
    return summary
