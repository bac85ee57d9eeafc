"""Soak test of a radixlm server: ≥ 1,000 mixed requests (native and OpenAI, chat and completions,
streaming and not, n > 1, JSON schema, regex, logprobs, long and short prompts), ~20% of clients
disconnecting at random moments, against a KV pool ~10x too small for the offered load; then checks
statuses, the hang bound, the server's health, leaks and greedy equality with a quiet replay.
Figures: docs/reliability.md, "Soak". The code is radixlm/bench/soak/ (tests/e2e/test_soak.py
runs it on a tiny model).

    python benchmarks/soak.py --server-args "--max-total-tokens 3000 --enable-invariant-checks" \\
        --num-requests 1000 --concurrency 64 --seed 0 --request-timeout 900 --output soak.json
    python benchmarks/soak.py --url http://127.0.0.1:30000 --num-requests 200
    python benchmarks/soak.py --fleet --hostile --server-args "--model-path M --quantization q8_0"

--fleet: the load through sglang-router over two workers sharing a Mooncake master, one worker's
scheduler frozen and the master killed mid-run (docs/reliability.md, "Fleet under chaos").

Exit status 0 when every check passed, 1 otherwise.
"""

import sys

from radixlm.bench.soak.cli import main

if __name__ == "__main__":
    sys.exit(main())
