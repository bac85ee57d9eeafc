"""What cache hit rate can a router reach? A model of the gsp workload over dp replicas, each an
LRU cache holding `--capacity` group prefixes: round_robin against the ideal cache-aware placement
(every group always on one replica). No engine; it gives the ceiling the measured figures sit
under, and shows the ratio is bounded by the replica count when arrivals are random.

    python benchmarks/router_hit_model.py --dp 2 4 8 --prompts-per-group 8 16
"""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict


def hit_rate(groups: int, per_group: int, dp: int, capacity: int, policy: str, seed: int) -> float:
    rnd = random.Random(seed)
    arrivals = [g for g in range(groups) for _ in range(per_group)]
    rnd.shuffle(arrivals)
    caches = [OrderedDict() for _ in range(dp)]
    hits = 0
    for i, g in enumerate(arrivals):
        cache = caches[i % dp if policy == "round_robin" else g % dp]
        if g in cache:
            hits += 1
            cache.move_to_end(g)
        else:
            cache[g] = True
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits / len(arrivals)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--dp", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--prompts-per-group", type=int, nargs="+", default=[8, 16])
    p.add_argument(
        "--capacity", type=int, default=None, help="prefixes a replica holds (default: groups / dp)"
    )
    p.add_argument("--seeds", type=int, default=50)
    a = p.parse_args()
    print("dp  per_group  capacity  round_robin  cache_aware  ratio")
    for dp in a.dp:
        cap = a.capacity or max(1, a.groups // dp)
        for ppg in a.prompts_per_group:
            rr, ca = (
                sum(hit_rate(a.groups, ppg, dp, cap, pol, s) for s in range(a.seeds)) / a.seeds
                for pol in ("round_robin", "cache_aware")
            )
            print(f"{dp:<3} {ppg:<10} {cap:<9} {rr:<12.3f} {ca:<12.3f} {ca / rr:.2f}")


if __name__ == "__main__":
    main()
