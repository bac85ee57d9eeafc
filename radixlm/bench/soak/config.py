"""The soak's settings: the request mix, the disconnects, the bounds the checks hold the server
to."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class SoakConfig:
    num_requests: int = 1000
    concurrency: int = 64
    seed: int = 0
    disconnect_rate: float = 0.2
    # Timed disconnects happen within this many seconds; None: within 1.5x the median latency of the
    # requests answered so far (8 s until 5 are), so that they hit queued, prefilling and decoding
    # requests alike however loaded the server is.
    disconnect_max_delay: float | None = None
    request_timeout: float = 600.0  # the hang bound: a request not over by then is a hang
    max_new_tokens: tuple[int, int] = (8, 64)
    short_words: tuple[int, int] = (3, 40)
    long_words: tuple[int, int] = (300, 2000)
    long_fraction: float = 0.3
    num_docs: int = 4
    greedy_fraction: float = 0.55
    stream_fraction: float = 0.5
    n_fraction: float = 0.12  # n in 2..3
    json_fraction: float = 0.1
    regex_fraction: float = 0.1
    logprob_fraction: float = 0.2
    drain_timeout: float = 60.0  # seconds to wait after the load for aborts to drain
    replay: bool = True  # the quiet replay of greedy requests
    allowed_statuses: tuple[int, ...] = (200, 429)
