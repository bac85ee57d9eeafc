"""The dashboard's cost to the server (issue 41): single-stream output tok/s of `radixlm bench
serving` with nobody watching against with a /dashboard/stream client connected, on one server,
rounds alternating (closed, open, closed, open, ...) so that drift hits both alike; medians and
their ratio are printed.

The watcher is either `sse` (a client reading /dashboard/stream in this process: what the page
costs the server, without the browser's own rendering) or `chromium` (Debian's headless chromium
on /dashboard, optionally pinned with --browser-cpus to cores the server does not use, with the
server pinned by --server-cpus: the figure is then the server's cost, not the page's drawing).

    python benchmarks/dashboard_overhead.py                          # sse watcher, 3 rounds each
    python benchmarks/dashboard_overhead.py --watcher chromium --server-cpus 0 --server-threads 1 \\
        --browser-cpus 1

Run it on an otherwise idle machine; the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class SseWatcher:
    """Reads /dashboard/stream (one tick a second, as the page) until stopped."""

    def __init__(self, url: str):
        import requests

        self._resp = requests.get(url + "/dashboard/stream", stream=True, timeout=30)
        self._resp.raise_for_status()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for _line in self._resp.iter_lines():
                pass  # read and dropped: the server's cost is in sending
        except Exception:
            pass

    def stop(self) -> None:
        self._resp.close()
        self._thread.join(5)


def snapshots(url: str) -> int:
    """The scheduler's count of dashboard snapshots taken: how many ticks a watcher really cost."""
    import requests

    return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"][
        "dashboard_snapshots"
    ]


class ChromiumWatcher:
    """Headless chromium with the dashboard page open."""

    def __init__(self, url: str, cpus: list[int] | None):
        exe = shutil.which("chromium")
        if exe is None:
            raise SystemExit("no chromium on PATH (Debian: apt-get install -y chromium)")
        cmd = [
            exe,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            url + "/dashboard",
        ]
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin
        )

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(30)


def bench_args(url: str, args) -> argparse.Namespace:
    from radixlm.bench.serving import add_args

    p = argparse.ArgumentParser()
    add_args(p)
    return p.parse_args(
        [
            "--base-url",
            url,
            "--dataset",
            "random",
            "--num-prompts",
            str(args.num_prompts),
            "--random-input-len",
            str(args.input_len),
            "--random-output-len",
            str(args.output_len),
            "--max-concurrency",
            "1",
            "--seed",
            "0",
            "--disable-tqdm",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M")
    ap.add_argument("--watcher", choices=("sse", "chromium"), default="sse")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each, alternating")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--server-threads", type=int, default=None, help="--num-threads of the server")
    ap.add_argument("--server-cpus", type=int, nargs="*", default=None)
    ap.add_argument("--browser-cpus", type=int, nargs="*", default=None)
    args = ap.parse_args()

    from radixlm.bench.serving import run
    from radixlm.model.loader import default_model_path
    from radixlm.server.process import ServerProcess

    extra = ["--num-threads", str(args.server_threads)] if args.server_threads else []
    server = ServerProcess(
        "--model-path", args.model_path or default_model_path(), *extra, cpus=args.server_cpus
    )
    try:
        ba = bench_args(server.url, args)
        run(ba)  # warm-up: kernels, allocator, caches
        closed, opened = [], []
        for i in range(args.rounds):
            closed.append(run(ba)["output_throughput"])
            before = snapshots(server.url)
            w = (
                SseWatcher(server.url)
                if args.watcher == "sse"
                else ChromiumWatcher(server.url, args.browser_cpus)
            )
            try:
                opened.append(run(ba)["output_throughput"])
            finally:
                w.stop()
            ticks = snapshots(server.url) - before
            print(
                f"round {i}: closed {closed[-1]:.2f} tok/s, open {opened[-1]:.2f} tok/s ({ticks}"
                " snapshots)",
                flush=True,
            )
    finally:
        server.stop()
    c, o = statistics.median(closed), statistics.median(opened)
    print(
        f"median output tok/s: closed {c:.2f}, open ({args.watcher}) {o:.2f},"
        f" {100 * (o / c - 1):+.2f}%"
    )


if __name__ == "__main__":
    main()
