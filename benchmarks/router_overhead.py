"""The cache-aware policy's cost per routed request with a tree of N entries (no HTTP).

    python benchmarks/router_overhead.py [--entries 10000] [--groups 16] [--prefix-chars 4000]

Fills the tree with gsp-like texts (a few long shared prefixes, each followed by a distinct
question), then times select() (match + insert) for new requests; prints the median and p99.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import time

from radixlm.router.policies import CacheAwareConfig, CacheAwarePolicy


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entries", type=int, default=10000)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument(
        "--prefix-chars", type=int, default=4000, help="characters of each group's shared prefix"
    )
    p.add_argument("--question-chars", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--requests", type=int, default=2000, help="timed requests after the fill")
    a = p.parse_args()
    rng = random.Random(0)
    words = lambda n: "".join(rng.choice(string.ascii_lowercase + "     ") for _ in range(n))
    prefixes = [words(a.prefix_chars) for _ in range(a.groups)]
    workers = [f"http://127.0.0.1:{30000 + i}" for i in range(a.workers)]
    policy = CacheAwarePolicy(CacheAwareConfig())
    loads = {w: 0 for w in workers}
    t0 = time.perf_counter()
    for _i in range(a.entries):
        policy.select(workers, loads, rng.choice(prefixes) + words(a.question_chars))
    fill = time.perf_counter() - t0
    times = []
    for _ in range(a.requests):
        text = rng.choice(prefixes) + words(a.question_chars)
        t = time.perf_counter()
        policy.select(workers, loads, text)
        times.append(time.perf_counter() - t)
    times.sort()
    print(
        f"{a.entries} entries ({policy.tree.size()} nodes, {sum(policy.tree.tenant_chars.values())}"
        f" characters over {a.workers} workers), filled in {fill:.1f} s"
    )
    print(
        f"select: median {1e3 * statistics.median(times):.3f} ms, p99"
        f" {1e3 * times[int(0.99 * len(times))]:.3f} ms ({a.prefix_chars + a.question_chars}"
        " characters a request)"
    )
    t = time.perf_counter()
    policy.tree.evict_tenant_by_size(policy.tree.tenant_chars[workers[0]] // 2)
    print(f"trimming one worker's tree by half: {1e3 * (time.perf_counter() - t):.1f} ms")


if __name__ == "__main__":
    main()
