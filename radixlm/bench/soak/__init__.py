"""Soak: many mixed requests against a KV pool far too small for the offered load, with clients
disconnecting at random moments; then checks that nothing failed, hung, died or leaked, and that
greedy outputs equal a quiet run's (docs/reliability.md, "Soak").

    python benchmarks/soak.py --server-args "--max-total-tokens 3000 --enable-invariant-checks"
    python benchmarks/soak.py --url http://127.0.0.1:30000
    python benchmarks/soak.py --fleet --hostile --server-args "--model-path M --quantization q8_0"

config.py    SoakConfig: the workload's mix, the bounds of the checks
workload.py  the seeded request mix (SoakRequest) and its fitting to the server's context
client.py    one request sent, disconnected on plan, its answer folded into a SoakResult
checks.py    what is wrong with an answer, what the server still holds after the load
runner.py    the load, the drain, the flush, the quiet replay; run() starts a server when asked
hostile.py   attackers and a /health prober alongside the load (issue 35's findings; --hostile)
fleet.py     --fleet: a Mooncake master, two workers sharing it, sglang-router over them
chaos.py     the fleet's chaos: a worker's scheduler frozen, the master killed, /health probed
report.py    the checks' verdicts and the figures (summarize), their text (format_summary)
cli.py       the command line (benchmarks/soak.py)

The workload is a seeded mix of: the native API (/generate) and the OpenAI API (/v1/completions,
/v1/chat/completions), streaming and not, n > 1, JSON schema and regex constraints, logprobs with
top logprobs, greedy and seeded sampling, short prompts and long ones (built on a few shared
documents, so that prompts share prefixes of many lengths). A share of the clients disconnect:
after a random delay (before the answer's first byte, or mid-stream) or after a random number of
stream events. `concurrency` clients send the requests back to back.

Checks (each printed; any failure makes main() return 1):
- status: every request answered 200 (or 429 when the server runs with --max-queued-requests);
  no 5xx, no other 4xx, no error event inside a stream, no dropped connection
- bound: every request ended (or was disconnected) within --request-timeout seconds
- outputs: every answered request has its n choices, none aborted by the server, constrained outputs
  that stopped match their schema / regex, logprobs are there (one per output token, top-k each
  on the native API), the n choices of a greedy request are equal
- alive: the server answers /health 200 (and, when this script started it, its process runs)
- leaks: once the load is over, nothing is tracked, running or waiting, every request slot is free,
  no radix node is locked and free + evictable KV == the pool; /flush_cache then frees it all
- greedy: every greedy (temperature 0) request that was not disconnected, sent again alone after
  the load, gives the same output (token ids on the native API, text on the OpenAI API)
"""
