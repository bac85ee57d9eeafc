"""Prefill time through the Engine (the scheduler process and all): prompts of random token ids,
each after flush_cache() so nothing is reused, max_new_tokens 1; the median of all but the first.

    python benchmarks/prefill_engine.py FILE --input-len 512 [--threads 1] [--repeats 6]

For a before/after of a kernel change, alternate runs of the two trees. The Engine's scheduler
process imports the installed radixlm (an editable install: that checkout), not PYTHONPATH's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_path")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=None, help="default: the engine's (all cores)")
    p.add_argument("--repeats", type=int, default=6)
    a = p.parse_args()

    from radixlm import Engine

    rng = random.Random(0)
    with Engine(
        model_path=a.model_path,
        log_level="warning",
        context_length=max(4096, 2 * a.input_len),
        num_threads=a.threads,
    ) as engine:
        times = []
        for _ in range(a.repeats):
            ids = [rng.randrange(100, 20000) for _ in range(a.input_len)]
            engine.flush_cache()
            t = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
            times.append(time.perf_counter() - t)
    rest = times[1:] or times
    print(
        f"prefill {a.input_len}: median {statistics.median(rest):.3f} s"
        f" ({a.input_len / statistics.median(rest):.1f} tok/s), min {min(rest):.3f},"
        f" all {' '.join(f'{x:.2f}' for x in rest)}"
    )


if __name__ == "__main__":
    main()
