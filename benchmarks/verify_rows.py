"""What a speculative verify row costs: one forward of R new query rows after a cached prefix,
default model, in-process (the model's own forward only: no HTTP, no sampling).

    python benchmarks/verify_rows.py [--prefix 300] [--rows 1,2,4,8,16,17,32] [--repeat 6]
    RADIXLM_KERNEL_ISA=avx2 python benchmarks/verify_rows.py   # the AVX2 tiles on a VNNI CPU

It drives the scheduler with the tests' in-process harness (tests/scheduler/harness.py).
Prints, per row count, the median forward time and the time per row; the extra cost of a row
over a 1-row step is what a draft token costs (speculative/cost_model.py measures the same
thing while serving).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import sys
import time

import radixlm  # noqa: F401  (before torch: huge pages for torch's buffers)
from radixlm.kernels.ops import ops
from radixlm.model.loader import default_model_path

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository root
from tests.scheduler.harness import Driver, make_scheduler


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-path", default=None, help="default: the embedded SmolLM2 GGUF")
    p.add_argument("--prefix", type=int, default=300, help="cached tokens before the new rows")
    p.add_argument("--rows", default="1,2,3,4,5,6,8,9,12,16,17,24,32")
    p.add_argument("--repeat", type=int, default=6)
    p.add_argument("--num-threads", type=int, default=None, help="default: every core")
    a = p.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    opts = {"enable_invariant_checks": False}
    if a.num_threads:
        opts["num_threads"] = a.num_threads
    s = make_scheduler(a.model_path or default_model_path(), **opts)
    d = Driver(s)
    times = collections.defaultdict(list)
    forward = s.runner.forward

    def timed(fb):
        t = time.perf_counter()
        out = forward(fb)
        times[len(fb.input_ids)].append(time.perf_counter() - t)
        return out

    s.runner.forward = timed
    rng = random.Random(0)
    prefix = [rng.randrange(100, 40000) for _ in range(a.prefix)]
    d.submit(prefix, max_new_tokens=1)
    while not d.idle():
        d.step()
    times.clear()
    for _ in range(a.repeat):
        for r in rows:  # the prefix is cached: each request's extend is its r new tokens
            d.submit(prefix + [rng.randrange(100, 40000) for _ in range(r)], max_new_tokens=1)
            while not d.idle():
                d.step()
    print(f"kernels: {ops().qlinear_isa()}, prefix {a.prefix} tokens, median of {a.repeat}")
    base = statistics.median(times[1]) if 1 in times else None
    for r in rows:
        t = statistics.median(times[r])
        extra = (
            f"  +{1000 * (t - base) / (r - 1):.2f} ms per row beyond the first"
            if base and r > 1
            else ""
        )
        print(f"rows {r:3d}: {1000 * t:7.2f} ms{extra}")


if __name__ == "__main__":
    main()
