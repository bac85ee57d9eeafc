"""Benchmarks of the hierarchical cache (figures in docs/benchmarks.md, "Hierarchical cache").

restart: time to first token of a request whose long prefix (a document) is on disk after a
    restart, against recomputing it on a server without the tiers. Per repetition: a server
    without --enable-hierarchical-cache computes document + question; a tiered server computes it
    and stores it; a new tiered server on the same directory answers another question on the same
    document. Each server answers a short unrelated request first (not measured).
gsp: the serving benchmark's generated-shared-prefix workload against a KV pool smaller than the
    groups' prefixes, with and without the tiers: output throughput and hit rate per tier.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time

import requests

from radixlm.server.process import ServerProcess


def ttft(url: str, ids: list[int]) -> float:
    t0 = time.perf_counter()
    with requests.post(
        url + "/generate",
        stream=True,
        timeout=600,
        json={
            "input_ids": ids,
            "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 4},
        },
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                return time.perf_counter() - t0
    raise RuntimeError("no streamed chunk")


def _hicache_info(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"]["hicache"]


def _server(extra: list[str], args, env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(
        *(["--model-path", args.model_path] if args.model_path else []),
        "--max-total-tokens",
        str(args.max_total_tokens),
        *extra,
        env=env,
    )


def restart(args) -> dict:
    rng = random.Random(args.seed)
    rows = []
    for rep in range(args.reps):
        doc = [rng.randrange(100, 40000) for _ in range(args.prefix_len)]
        q1, q2, warm = ([rng.randrange(100, 40000) for _ in range(24)] for _ in range(3))
        storage = tempfile.mkdtemp(prefix="radixlm-hicache-bench-")
        tiers = [
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "file",
            "--hicache-storage-dir",
            storage,
            *args.hicache_args.split(),
        ]
        try:
            s = _server([], args)
            ttft(s.url, warm)
            recompute = ttft(s.url, doc + q1)
            s.stop()
            s = _server(tiers, args)
            ttft(s.url, warm)
            write_run = ttft(s.url, doc + q1)
            deadline = time.time() + 120
            while (
                _hicache_info(s.url)["l3_chunks_written"] < len(doc) // args.chunk
                and time.time() < deadline
            ):
                time.sleep(0.2)
            s.stop()
            s = _server(tiers, args)
            ttft(s.url, warm)
            from_disk = ttft(s.url, doc + q2)
            info = _hicache_info(s.url)
            l1_hit = ttft(s.url, doc + warm)  # the document in L1 now: the floor
            s.stop()
        finally:
            shutil.rmtree(storage, ignore_errors=True)
        row = {
            "rep": rep,
            "recompute_s": recompute,
            "tiered_first_s": write_run,
            "from_disk_s": from_disk,
            "l1_hit_s": l1_hit,
            "speedup": recompute / from_disk,
            "l3_hit_tokens": info["l3_hit_tokens"],
            "l3_load_s": info["l3_load_seconds"],
            "l2_load_s": info["l2_load_seconds"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    med = {
        k: statistics.median(r[k] for r in rows)
        for k in ("recompute_s", "tiered_first_s", "from_disk_s", "l1_hit_s", "speedup")
    }
    return {"bench": "restart", "prefix_len": args.prefix_len, "reps": rows, "median": med}


def shared(args) -> dict:
    """Two servers sharing a Mooncake Store (--hicache-storage-backend mooncake, a local master):
    per rep, B's TTFT on a document neither has seen (recomputed), then A answers another document
    (written through to the store) and B's TTFT on it (its prefix read from Mooncake)."""
    from radixlm.bench.mooncake_master import MooncakeMaster

    rng = random.Random(args.seed)
    master = MooncakeMaster(segment_bytes=1 << 30)
    tiers = [
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "mooncake",
        "--hicache-storage-chunk-size",
        str(args.chunk),
        *args.hicache_args.split(),
    ]
    env = master.env("bench-storage-key-" + "0" * 16)
    servers = []
    try:
        for _ in range(2):
            servers.append(_server(tiers, args, env))
        a, b = servers
        doc = lambda: [rng.randrange(100, 40000) for _ in range(args.prefix_len)]
        q = lambda: [rng.randrange(100, 40000) for _ in range(24)]
        ttft(a.url, q())
        ttft(b.url, q())
        rows = []
        for rep in range(args.reps):
            recompute = ttft(b.url, doc() + q())
            d = doc()
            written = _hicache_info(a.url)["l3_chunks_written"]
            ttft(a.url, d + q())
            deadline = time.time() + 120
            while (
                _hicache_info(a.url)["l3_chunks_written"] < written + len(d) // args.chunk
                and time.time() < deadline
            ):
                time.sleep(0.2)
            before = _hicache_info(b.url)["l3_hit_tokens"]
            from_store = ttft(b.url, d + q())
            hit = _hicache_info(b.url)["l3_hit_tokens"] - before
            row = {
                "rep": rep,
                "recompute_s": recompute,
                "from_mooncake_s": from_store,
                "speedup": recompute / from_store,
                "l3_hit_tokens": hit,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for s in servers:
            s.stop()
        master.kill()
    med = {
        k: statistics.median(r[k] for r in rows)
        for k in ("recompute_s", "from_mooncake_s", "speedup")
    }
    return {"bench": "shared", "prefix_len": args.prefix_len, "reps": rows, "median": med}


def gsp(args) -> dict:
    from radixlm.bench.serving import add_args, run

    out = {}
    for name, extra in (
        ("no tiers", []),
        ("tiers", ["--enable-hierarchical-cache", *args.hicache_args.split()]),
    ):
        s = _server(extra, args)
        try:
            p = argparse.ArgumentParser()
            add_args(p)
            bench_args = p.parse_args(
                ["--base-url", s.url, "--dataset", "gsp", "--disable-tqdm", *args.gsp_args.split()]
            )
            if args.model_path:
                bench_args.tokenizer = args.model_path
            res = run(bench_args)
            st = requests.get(s.url + "/get_server_info", timeout=30).json()["internal_state"]
        finally:
            s.stop()
        prompt = max(st["prompt_tokens"], 1)
        hc = st.get("hicache") or {}
        l2, l3 = hc.get("l2_hit_tokens", 0), hc.get("l3_hit_tokens", 0)
        out[name] = {
            "output_throughput": res["output_throughput"],
            "completed": res["completed"],
            "mean_ttft_ms": res.get("mean_ttft_ms"),
            "duration_s": res.get("duration_s"),
            # Of the prompt tokens: served from L1 directly, loaded back from L2, computed.
            "hit_rate": {
                "l1": (st["cached_tokens"] - l2) / prompt,
                "l2": l2 / prompt,
                "l3": l3 / prompt,
            },
            "cache_hit_rate": st["cache_hit_rate"],
        }
        print(name, json.dumps(out[name]), flush=True)
    out["speedup"] = out["tiers"]["output_throughput"] / out["no tiers"]["output_throughput"]
    return {"bench": "gsp", "args": args.gsp_args, "results": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("bench", choices=["restart", "shared", "gsp"])
    p.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument(
        "--max-total-tokens", type=int, default=8192, help="the KV pool (L1) of every server"
    )
    p.add_argument("--hicache-args", default="", help="more flags for the tiered servers")
    p.add_argument("--prefix-len", type=int, default=4000, help="restart: tokens of the document")
    p.add_argument(
        "--chunk", type=int, default=64, help="restart: the servers' --hicache-storage-chunk-size"
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--gsp-args",
        default=(
            "--gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 1024 "
            "--gsp-question-len 32 --gsp-output-len 32 --max-concurrency 8"
        ),
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-file", default=None, help="append the result as one JSON line")
    args = p.parse_args(argv)
    res = {"restart": restart, "shared": shared, "gsp": gsp}[args.bench](args)
    print(json.dumps({k: v for k, v in res.items() if k != "reps"}, indent=1))
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0
