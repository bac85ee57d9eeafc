"""DPDispatcher: which DP-attention rank serves a request (rank 0 decides, for every rank;
SGLang's DataParallelController with --load-balance-method).

Methods (`--load-balance-method`):
- auto / cache_aware (radixlm's default): the rank that was sent the longest prefix of this prompt,
  when that covers more than CACHE_THRESHOLD of it and the ranks' loads are not imbalanced; else the
  rank with the fewest requests (ties: the smaller prefix index, then the lower rank). The rule of
  radixlm's cache-aware router (router/policies.py), over token ids instead of text.
- round_robin: in turn. total_requests / total_tokens: the fewest requests / tokens.

A rank's load is what it reported at the last step (queued and running requests, their tokens:
DPView, filled by parallel/dp_attention.py) plus what was sent to it since. Its prefix index
remembers, per BLOCK tokens, a hash chained over the prompt so far (LRU, as many blocks as the
rank's KV pool holds): an approximation of its radix cache, as the router's tree is of a server's. A
session's turns stay on the rank of its first turn (its KV is pinned there).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from radixlm.ipc import BindSessionReq, CloseSessionReq, TokenizedGenerateReqInput

LOAD_BALANCE_METHODS = ("auto", "cache_aware", "round_robin", "total_requests", "total_tokens")
BLOCK = 16  # tokens per prefix-index entry
CACHE_THRESHOLD = 0.5  # share of the prompt a rank must have been sent to follow it
BALANCE_ABS_THRESHOLD = 32  # requests of difference ...
BALANCE_REL_THRESHOLD = 1.5  # ... and this ratio of most to fewest before load wins over the cache


@dataclass
class DPView:
    """Every rank's state as of the last step (parallel/dp_attention.py fills it; rank 0's
    dispatcher and channels read it)."""

    size: int
    timeouts_ms: list[int] = field(
        default_factory=list
    )  # how long each rank would wait for a message
    requests: list[int] = field(default_factory=list)  # requests each holds (waiting, running, ...)
    tokens: list[int] = field(default_factory=list)  # their prompt and output tokens so far
    # New requests were handed out since (to any rank: every rank sees the whole routed list).
    stale: bool = False

    def __post_init__(self):
        self.timeouts_ms = self.timeouts_ms or [0] * self.size
        self.requests = self.requests or [0] * self.size
        self.tokens = self.tokens or [0] * self.size


class PrefixIndex:
    """Per rank, the prompts it was sent, as chained block hashes (LRU, bounded)."""

    def __init__(self, size: int, capacity_blocks: int):
        self.seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(size)]
        self.capacity = max(1, capacity_blocks)

    @staticmethod
    def chain(ids: list[int], namespace: Any) -> list[int]:
        h, out = hash(namespace), []
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            h = hash((h, tuple(ids[end - BLOCK : end])))
            out.append(h)
        return out

    def matched(self, rank: int, chain: list[int]) -> int:
        """Leading blocks of chain the rank was sent."""
        seen = self.seen[rank]
        return next((i for i, h in enumerate(chain) if h not in seen), len(chain))

    def insert(self, rank: int, chain: list[int]) -> None:
        seen = self.seen[rank]
        for h in chain:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.capacity:
            seen.popitem(last=False)


class DPDispatcher:
    def __init__(self, view: DPView, method: str = "auto", capacity_tokens: int = 1 << 20):
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(
                f"load_balance_method must be one of {', '.join(LOAD_BALANCE_METHODS)}, got"
                f" {method!r}"
            )
        self.view, self.method = view, method
        self.index = PrefixIndex(view.size, capacity_tokens // BLOCK)
        self._turn = itertools.count()
        self.sent_requests = [
            0
        ] * view.size  # since the last step (the view does not count them yet)
        self.sent_tokens = [0] * view.size
        self.sessions: dict[str, int] = {}  # session id -> its rank
        self.session_rids: dict[str, str] = {}  # rid of a session's next turn -> its session id
        self.stats = {"requests": [0] * view.size, "cache_hits": 0}

    def step_seen(self) -> None:
        """The view now counts every request sent before (parallel/dp_attention.py calls it after
        each exchange)."""
        self.sent_requests = [0] * self.view.size
        self.sent_tokens = [0] * self.view.size

    def assign(self, msg: Any) -> int | None:
        """The rank msg goes to; None: every rank (aborts, control calls, session bindings)."""
        if isinstance(msg, BindSessionReq):
            self.session_rids[msg.rid] = msg.session_id
        elif isinstance(msg, CloseSessionReq):
            self.sessions.pop(msg.session_id, None)
        if not isinstance(msg, TokenizedGenerateReqInput):
            return None
        session = self.session_rids.pop(msg.rid, None)
        rank = self.sessions.get(session) if session is not None else None
        chain = PrefixIndex.chain(msg.input_ids, (msg.cache_namespace, msg.lora_id))
        if rank is None:
            rank = self._choose(chain, len(msg.input_ids))
        if session is not None:
            self.sessions[session] = rank
        self.index.insert(rank, chain)
        self.sent_requests[rank] += 1
        self.sent_tokens[rank] += len(msg.input_ids)
        self.stats["requests"][rank] += 1
        return rank

    def loads(self) -> list[int]:
        if self.method == "total_tokens":
            return [a + b for a, b in zip(self.view.tokens, self.sent_tokens)]
        return [a + b for a, b in zip(self.view.requests, self.sent_requests)]

    def _choose(self, chain: list[int], length: int) -> int:
        ranks = range(self.view.size)
        if self.method == "round_robin":
            return next(self._turn) % self.view.size
        loads = self.loads()
        if self.method in ("auto", "cache_aware") and not _imbalanced(loads):
            matched = [self.index.matched(r, chain) for r in ranks]
            best = max(ranks, key=lambda r: (matched[r], -loads[r], -r))
            if matched[best] * BLOCK > CACHE_THRESHOLD * length:
                self.stats["cache_hits"] += 1
                return best
        return min(ranks, key=lambda r: (loads[r], len(self.index.seen[r]), r))

    def info(self) -> dict:
        return {"method": self.method, **self.stats}


def _imbalanced(loads: list[int]) -> bool:
    hi, lo = max(loads), min(loads)
    return hi - lo > BALANCE_ABS_THRESHOLD and hi > lo * BALANCE_REL_THRESHOLD
