"""The last finished requests, for /dashboard: one small record each (prompt head, cached share,
TTFT, tokens, finish reason), kept in a ring. Recorded by the TokenizerManager's Observability when
a request's final chunk arrives: one append per request, nothing per token."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass

PROMPT_HEAD_CHARS = 120
PROMPT_HEAD_TOKENS = 48  # a prompt given as ids (the chat routes): its head is these decoded
MAX_RECENT = 200


@dataclass(frozen=True)
class RecentRequest:
    rid: str
    finished_at: float  # wall time (time.time())
    prompt_head: str | None  # the prompt's first characters (None: without --dashboard-show-text)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft: float | None  # seconds
    e2e_latency: float  # seconds
    finish_reason: str | None  # SGLang's finish_reason type: stop, length, abort

    @property
    def itl(self) -> float | None:
        """Mean inter-token latency (the scheduler ships no per-token times)."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return max(0.0, self.e2e_latency - self.ttft) / (self.completion_tokens - 1)

    def as_dict(self, with_text: bool) -> dict:
        d = asdict(self)
        d["cached_share"] = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        d["itl"] = self.itl
        if not with_text:  # prompts are user data: shown only with --dashboard-show-text
            d["prompt_head"] = None
        return d


class RecentRequests:
    def __init__(self, maxlen: int = MAX_RECENT, keep_text: bool = False):
        """keep_text: --dashboard-show-text; without it no prompt text is kept at all."""
        self.items: deque[RecentRequest] = deque(maxlen=maxlen)
        self.keep_text = keep_text
        self.finished = 0  # all ever recorded: a client sees what it missed between ticks

    def add(
        self,
        rid: str,
        prompt_text: str | None,
        meta: dict,
        finish_reason: dict | None,
        e2e_latency: float,
    ) -> None:
        self.finished += 1
        self.items.append(
            RecentRequest(
                rid=rid,
                finished_at=time.time(),
                prompt_head=(
                    prompt_text[:PROMPT_HEAD_CHARS]
                    if self.keep_text and isinstance(prompt_text, str)
                    else None
                ),
                prompt_tokens=meta.get("prompt_tokens", 0),
                cached_tokens=meta.get("cached_tokens", 0),
                completion_tokens=meta.get("completion_tokens", 0),
                ttft=meta.get("ttft"),
                e2e_latency=e2e_latency,
                finish_reason=(finish_reason or {}).get("type"),
            )
        )

    def latest(self, n: int) -> list[RecentRequest]:
        return list(self.items)[-n:][::-1]  # newest first
