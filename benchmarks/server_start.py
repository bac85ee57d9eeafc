"""A server's start: seconds from `radixlm serve` to /health 200, and the CPU its processes spent
meanwhile (the server and everything under it), median of --repeat starts, then its stop.

    python benchmarks/server_start.py --model-path DIR [--repeat 5] [--forked]

--forked starts it as the test suite does (tests/forked_servers.py: forked from a preloaded fork
server instead of exec'd). Run alone: a second process on the cores changes both figures."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def one_start(model_path: str) -> tuple[float, float, float]:
    import psutil

    from radixlm.server.process import ServerProcess

    t0 = time.perf_counter()
    s = ServerProcess("--model-path", model_path, "--num-threads", "1", "--kv-memory-gb", "0.05")
    healthy = time.perf_counter() - t0
    root = psutil.Process(s.proc.pid)
    cpu = sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])
    t1 = time.perf_counter()
    s.stop()
    return healthy, cpu, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--forked", action="store_true", help="as the tests start servers")
    args = ap.parse_args()
    if args.forked:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests import forked_servers

        forked_servers.install()
    runs = [one_start(args.model_path) for _ in range(args.repeat)]
    for name, k in (("healthy after (s)", 0), ("CPU to healthy (s)", 1), ("stop (s)", 2)):
        values = sorted(r[k] for r in runs)
        print(
            f"{name:20} median {statistics.median(values):6.2f}  min {values[0]:6.2f}"
            f"  max {values[-1]:6.2f}"
        )


if __name__ == "__main__":
    main()
