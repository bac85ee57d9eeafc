"""DP attention: one answer to a control call from every rank's answer (rank 0 sends it).

Every rank handles every control call, in the order rank 0 broadcast them, and answers the calls of
one kind in that order, each when it is done (a weight update waits for the rank's own requests),
so the n-th answers of a kind from each rank belong together. ReplyMerger keeps them per kind and
rank, and sends the merged answer when every rank gave its n-th:
- a call that failed on any rank (ControlFailed) failed;
- success only when every rank succeeded (the failures' messages named by rank), counts summed;
- the internal state: numbers summed over the ranks (lists element-wise, nested dicts too; the
  cache hit rate recomputed), each rank's own state under `dp_ranks`;
- the dashboard snapshot: that state, and every rank's radix tree (node ids made distinct).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

from radixlm.ipc import ControlFailed, DashboardSnapshotReqOutput, GetInternalStateReqOutput

AVERAGED = ("grammar_mask_ms_per_step", "decode_outside_share")  # per-step figures: the ranks' mean
OWN = ("dp_rank", "pid")  # a rank's identity: under dp_ranks only
_TREE_ID_STRIDE = 1 << 40  # rank r's node ids become r * stride + id (exact in a JSON number)


class ReplyMerger:
    def __init__(self, size: int, send: Callable[[Any], None]):
        self.size = size
        self.send = send
        self.pending: dict[type, list[deque]] = {}

    def add(self, rank: int, msg: Any) -> None:
        kind = msg.reply_type if isinstance(msg, ControlFailed) else type(msg)
        queues = self.pending.setdefault(kind, [deque() for _ in range(self.size)])
        queues[rank].append(msg)
        if all(queues):
            self.send(merge_replies([q.popleft() for q in queues]))

    def waiting(self) -> int:
        """Answers held until the other ranks give theirs."""
        return sum(len(q) for queues in self.pending.values() for q in queues)


def merge_replies(replies: list) -> Any:
    failed = next((r for r in replies if isinstance(r, ControlFailed)), None)
    if failed is not None:
        return failed
    first = replies[0]
    if isinstance(first, GetInternalStateReqOutput):
        return GetInternalStateReqOutput(merge_states([r.state for r in replies]))
    if isinstance(first, DashboardSnapshotReqOutput):
        return DashboardSnapshotReqOutput(
            merge_states([r.state for r in replies]), _forest([r.tree for r in replies])
        )
    fields = dataclasses.fields(first) if dataclasses.is_dataclass(first) else ()
    if any(f.name == "success" for f in fields):  # a control call's answer (ipc.py)
        bad = [(k, r) for k, r in enumerate(replies) if not r.success]
        counts = {
            f.name: sum(getattr(r, f.name) for r in replies)
            for f in fields
            if _is_number(getattr(first, f.name))
        }
        if bad:
            message = "; ".join(f"dp rank {k}: {r.message}" for k, r in bad)
            return dataclasses.replace(bad[0][1], **counts, message=message)
        return dataclasses.replace(first, **counts)
    return first  # a weight read back: rank 0's copy


def merge_states(states: list[dict]) -> dict:
    merged = _summed(states)
    prompt = merged.get("prompt_tokens")
    if "cache_hit_rate" in merged:
        merged["cache_hit_rate"] = merged.get("cached_tokens", 0) / prompt if prompt else 0.0
    for key in AVERAGED:
        values = [s[key] for s in states if _is_number(s.get(key))]
        if key in merged and values:
            merged[key] = sum(values) / len(values)
    for key in OWN:
        merged.pop(key, None)
    merged["dp_ranks"] = states
    return merged


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _summed(values: list) -> Any:
    first = values[0]
    if all(_is_number(v) for v in values):
        return sum(values)
    if all(isinstance(v, dict) for v in values):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: _summed([v[k] for v in values if k in v]) for k in keys}
    if (
        all(isinstance(v, list) for v in values)
        and len({len(v) for v in values}) == 1
        and first
        and all(_is_number(x) for v in values for x in v)
    ):
        return [sum(xs) for xs in zip(*values)]
    return first


def _forest(trees: list[list[dict]]) -> list[dict]:
    out = []
    for rank, nodes in enumerate(trees):
        for n in nodes:
            parent = n.get("parent")
            out.append(
                {
                    **n,
                    "id": rank * _TREE_ID_STRIDE + n["id"],
                    "dp_rank": rank,
                    "parent": None if parent is None else rank * _TREE_ID_STRIDE + parent,
                }
            )
    return out
