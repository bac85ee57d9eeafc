"""Time to first token of a prefix loaded from disk (L3) with and without CPU hogs beside the server
(issue 35, finding 7: "3.3k tokens from disk took 10.4 s on a busy machine against 0.28 s idle").

    python benchmarks/hicache_load_under_load.py --prefix-len 3300 --rounds 2 --hogs 2
    python benchmarks/hicache_load_under_load.py --copy-only --hogs 4

One server stores the document (chunks of 64 tokens) and stops; a second server on the same
directory answers document + question (streaming, time to the first chunk) after each
`/flush_cache?level=l2` (L1 and L2 emptied, the chunks stay on disk), alternating rounds with no
hog and with `--hogs` busy-loop processes running, then another question on the document (an L1
hit: the same prefill without any load), and last a document of the same length nowhere cached,
computed beside the hogs. Prints one JSON line per measurement with the server's own
split: l3_load_s (request arrival -> every chunk in L2), l2_load_s (L2 -> L1 copy).

--copy-only: just the L2 -> L1 copy of --prefix-len tokens in the default model's geometry (30
layers, 3 KV heads of 64, float16) on 2 torch threads, median of 7, without and with the hogs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import shutil
import tempfile
import time

import requests

from radixlm.bench.hicache import _hicache_info, ttft
from radixlm.server.process import ServerProcess


def _spin() -> None:
    while True:
        pass


def copy_only(args) -> None:
    import statistics

    import torch

    from radixlm.cache.host_pool import HostKVPool
    from radixlm.cache.memory_pool import TokenToKVPool

    torch.set_num_threads(2)
    dev = TokenToKVPool(8192, 30, 3, 64, torch.float16)
    host = HostKVPool(8192, dev, torch.float16)
    idx = torch.arange(1, args.prefix_len + 1)
    for rnd in range(args.rounds):
        for hogs in (0, args.hogs):
            procs = [mp.Process(target=_spin, daemon=True) for _ in range(hogs)]
            for h in procs:
                h.start()
            time.sleep(0.3)
            times = []
            for _ in range(7):
                t = time.perf_counter()
                host.load_into(dev, idx, idx)
                times.append(time.perf_counter() - t)
            for h in procs:
                h.kill()
                h.join()
            print(
                json.dumps(
                    {
                        "round": rnd,
                        "hogs": hogs,
                        "l2_to_l1_ms": round(statistics.median(times) * 1e3, 1),
                    }
                ),
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", default=None)
    p.add_argument("--prefix-len", type=int, default=3300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hogs", type=int, default=2)
    p.add_argument("--server-args", default="", help="more flags for both servers")
    p.add_argument("--copy-only", action="store_true")
    args = p.parse_args()
    if args.copy_only:
        return copy_only(args)
    rng = random.Random(0)
    doc = [rng.randrange(100, 40000) for _ in range(args.prefix_len)]
    warm, q, q2 = ([rng.randrange(100, 40000) for _ in range(24)] for _ in range(3))
    storage = tempfile.mkdtemp(prefix="radixlm-l3-load-")
    flags = [
        *(["--model-path", args.model_path] if args.model_path else []),
        "--max-total-tokens",
        "8192",
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
        storage,
        *args.server_args.split(),
    ]
    try:
        s = ServerProcess(*flags)
        recompute = ttft(s.url, doc + q)
        deadline = time.time() + 300
        while _hicache_info(s.url)["l3_chunks_written"] < len(doc) // 64 and time.time() < deadline:
            time.sleep(0.2)
        s.stop()
        print(json.dumps({"recompute_s": round(recompute, 3)}), flush=True)
        s = ServerProcess(*flags)
        ttft(s.url, warm)
        for rnd in range(args.rounds):
            for hogs in (0, args.hogs):
                for _ in range(100):  # the last request may still be finishing
                    if (
                        requests.post(s.url + "/flush_cache?level=l2", timeout=60).status_code
                        == 200
                    ):
                        break
                    time.sleep(0.1)
                before = _hicache_info(s.url)
                procs = [mp.Process(target=_spin, daemon=True) for _ in range(hogs)]
                for h in procs:
                    h.start()
                time.sleep(0.5)
                try:
                    t = ttft(s.url, doc + q)
                    l1 = ttft(
                        s.url, doc + q2
                    )  # the document in L1 now: the same prefill without a load
                finally:
                    for h in procs:
                        h.kill()
                        h.join()
                info = _hicache_info(s.url)
                print(
                    json.dumps(
                        {
                            "round": rnd,
                            "hogs": hogs,
                            "from_disk_s": round(t, 3),
                            "l1_hit_s": round(l1, 3),
                            "l3_hit_tokens": info["l3_hit_tokens"] - before["l3_hit_tokens"],
                            "l3_load_s": round(
                                info["l3_load_seconds"] - before["l3_load_seconds"], 3
                            ),
                            "l2_load_s": round(
                                info["l2_load_seconds"] - before["l2_load_seconds"], 3
                            ),
                        }
                    ),
                    flush=True,
                )
        # Recomputing a document of the same length (nowhere cached) beside the hogs: what a load
        # saves.
        other = [rng.randrange(100, 40000) for _ in range(args.prefix_len)]
        procs = [mp.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
        for h in procs:
            h.start()
        time.sleep(0.5)
        try:
            print(
                json.dumps({"hogs": args.hogs, "recompute_s": round(ttft(s.url, other + q), 3)}),
                flush=True,
            )
        finally:
            for h in procs:
                h.kill()
                h.join()
        s.stop()
    finally:
        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
