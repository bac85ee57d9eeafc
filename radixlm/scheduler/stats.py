"""Scheduler counters: cache hit rate, throughput, and the periodic decode log line."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class SchedulerStats:
    max_total_num_tokens: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0  # forwards that ran a prefill and a decode step together
    extend_tokens: int = 0
    extend_steps: int = 0  # forwards that ran a prefill (mixed ones included)
    extend_seconds: float = 0.0  # their forward + sampling time
    decode_seconds: float = 0.0  # forward + sampling time of decode-only steps
    num_retracted: int = 0
    jump_forward_tokens: int = 0  # output tokens appended by jump-forward instead of decoding
    grammar_mask_seconds: float = 0.0  # filling + applying vocab masks
    grammar_mask_steps: int = 0
    # Back-to-back decode steps: launch-to-launch wall time, and the forward + sampling time
    # of the same steps; their difference is the time the model waited on the scheduler.
    decode_wall_seconds: float = 0.0
    decode_busy_seconds: float = 0.0
    _last_decode: tuple | None = None  # (launch time, forward seconds) of the previous decode step
    # (time, tokens) of recent decode steps for the log line's throughput.
    _recent: deque = field(default_factory=lambda: deque(maxlen=64))

    def on_prefill(self, prompt_tokens: int, cached: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached

    def on_extend(self, num_tokens: int, seconds: float) -> None:
        self.extend_tokens += num_tokens
        self.extend_steps += 1
        self.extend_seconds += seconds
        self._last_decode = None

    def on_mixed(self, extend_tokens: int, num_decode: int, seconds: float) -> None:
        self.on_extend(extend_tokens, seconds)
        self.mixed_steps += 1
        self.generated_tokens += num_decode
        self._recent.append((time.perf_counter(), num_decode))

    def on_decode(self, batch_size: int, seconds: float, launch_time: float | None = None) -> None:
        self.decode_steps += 1
        self.generated_tokens += batch_size
        self.decode_seconds += seconds
        self._recent.append((time.perf_counter(), batch_size))
        if launch_time is not None:
            if self._last_decode is not None:
                self.decode_wall_seconds += launch_time - self._last_decode[0]
                self.decode_busy_seconds += self._last_decode[1]
            self._last_decode = (launch_time, seconds)

    @property
    def decode_outside_share(self) -> float | None:
        """Share of back-to-back decode time spent outside forward + sampling."""
        if self.decode_wall_seconds <= 0:
            return None
        return max(0.0, 1.0 - self.decode_busy_seconds / self.decode_wall_seconds)

    def reset_cache_stats(self) -> None:
        self.prompt_tokens = self.cached_tokens = 0
        self.decode_wall_seconds = self.decode_busy_seconds = 0.0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def gen_throughput(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        span = self._recent[-1][0] - self._recent[0][0]
        return sum(n for _, n in list(self._recent)[1:]) / span if span > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_hit_rate": self.cache_hit_rate,
            "generated_tokens": self.generated_tokens,
            "num_retracted": self.num_retracted,
            "jump_forward_tokens": self.jump_forward_tokens,
            "grammar_mask_ms_per_step": (
                1000 * self.grammar_mask_seconds / max(self.grammar_mask_steps, 1)
            ),
            "decode_steps": self.decode_steps,
            "decode_seconds": self.decode_seconds,
            "extend_steps": self.extend_steps,
            "extend_tokens": self.extend_tokens,
            "extend_seconds": self.extend_seconds,
            "mixed_steps": self.mixed_steps,
            "decode_outside_share": self.decode_outside_share,
            "gen_throughput": self.gen_throughput(),  # tokens/s over the recent decode steps
        }

    def decode_log_line(
        self, kv_free: int, evictable: int, running: int, waiting: int, suffix: str = ""
    ) -> str:
        used = self.max_total_num_tokens - kv_free
        return (
            f"Decode: running {running}, waiting {waiting}, KV usage"
            f" {used / self.max_total_num_tokens:.1%} ({used} tokens, {evictable} evictable), cache"
            f" hit rate {self.cache_hit_rate:.1%}, gen throughput {self.gen_throughput():.1f}"
            f" tok/s, outside forward {100 * (self.decode_outside_share or 0):.1f}%{suffix}"
        )
