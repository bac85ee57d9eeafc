"""Scheduling policies (order of the waiting queue) and the admission budget (PrefillAdder)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from radixlm.scheduler.batch import Req

# LPM costs a tree walk per waiting request; past this queue length fall back to FCFS.
LPM_MAX_QUEUE = 128
# A request whose uncached prefix shares at least this many tokens with a request already in
# the batch waits a round (SGLang's in-batch prefix caching check).
IN_BATCH_PREFIX_MIN = 32
# Cap on the decode tokens reserved for one running request.
CLIP_MAX_NEW_TOKENS = 4096


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache, disable_radix_cache: bool, seed: int = 0):
        self.policy = policy
        self.tree_cache = tree_cache
        self.disable_radix_cache = disable_radix_cache
        self.rng = random.Random(seed)

    def calc_priority(self, queue: list[Req]) -> None:
        """Sorts `queue` in place: request priority first (higher first), then the policy."""
        policy = self.policy
        if policy in ("lpm", "dfs-weight") and (self.disable_radix_cache or len(queue) > LPM_MAX_QUEUE):
            policy = "fcfs"
        if policy in ("lpm", "dfs-weight"):
            for r in queue:
                if r.req_pool_idx is None:
                    prefix, node = self.tree_cache.match_prefix(r.origin_input_ids + r.output_ids)
                    r.prefix_len_hint, r.last_node = len(prefix), node
        if policy == "fcfs":
            queue.sort(key=lambda r: r.arrival_time)
        elif policy == "lpm":
            queue.sort(key=lambda r: (-r.prefix_len_hint, r.arrival_time))
        elif policy == "lof":
            queue.sort(key=lambda r: (-r.sampling_params.max_new_tokens, r.arrival_time))
        elif policy == "random":
            self.rng.shuffle(queue)
        elif policy == "dfs-weight":
            queue[:] = self._dfs_weight_order(queue)
        # Stable sort: priority dominates, the policy order breaks ties.
        if any(r.priority is not None for r in queue):
            queue.sort(key=lambda r: -(r.priority or 0))

    def _dfs_weight_order(self, queue: list[Req]) -> list[Req]:
        """Visit the tree depth-first, heavier subtrees (more waiting requests) first, so
        requests that share a prefix run together and the prefix stays cached."""
        root = self.tree_cache.root_node
        by_node: dict[int, list[Req]] = defaultdict(list)
        weight: dict[int, int] = defaultdict(int)
        for r in queue:
            node = r.last_node or root
            by_node[id(node)].append(r)
            while node is not None:
                weight[id(node)] += 1
                node = node.parent
        out: list[Req] = []
        stack = [root]
        while stack:
            node = stack.pop()
            out.extend(sorted(by_node.get(id(node), []), key=lambda r: r.arrival_time))
            kids = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
            kids.sort(key=lambda c: weight[id(c)])  # popped last = heaviest first
            stack.extend(kids)
        return out


@dataclass
class PrefillAdder:
    """Admits waiting requests while free + evictable KV covers their new tokens plus a
    reserve for the future tokens of everything running."""

    tree_cache: object
    rem_total_tokens: int  # free + evictable - reserve of running requests
    rem_input_tokens: int  # max_prefill_tokens left in this batch
    rem_chunk_tokens: Optional[int]  # chunked_prefill_size left, None = no chunking
    new_token_ratio: float
    free_req_slots: int
    can_run: list[Req] = field(default_factory=list)
    new_chunked_req: Optional[Req] = None

    @staticmethod
    def reserve_for(req: Req, ratio: float) -> int:
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        return int(max(0, min(left, CLIP_MAX_NEW_TOKENS)) * ratio)

    def add_one_req(self, req: Req, nothing_running: bool) -> bool:
        """Admit `req` (maybe only a chunk of it). Returns False when admission must stop."""
        new_req = req.req_pool_idx is None  # a pending chunked request already holds its slot and lock
        if new_req and self.free_req_slots <= 0:
            return False
        ext = req.extend_input_len
        chunking = self.rem_chunk_tokens is not None
        limit = min(self.rem_chunk_tokens, self.rem_input_tokens) if chunking else self.rem_input_tokens
        if not chunking and not self.can_run:
            limit = ext  # without chunking the first prompt always fits the input budget
        take = min(ext, limit)
        if take < ext and not chunking:
            return False
        # Lock the matched prefix first: what it pins is no longer evictable budget.
        delta = self.tree_cache.inc_lock_ref(req.last_node) if new_req else 0
        self.rem_total_tokens += delta
        need = take if take < ext else take + self.reserve_for(req, self.new_token_ratio)
        if need > self.rem_total_tokens:
            # Progress first: with nothing running, admit what fits (a chunk, or the whole prompt).
            if nothing_running and not self.can_run and chunking:
                take = min(take, self.rem_total_tokens)
                need = take
            elif not (nothing_running and not self.can_run and ext <= self.rem_total_tokens):
                take = 0
        if take <= 0:
            if new_req:
                self.rem_total_tokens += self.tree_cache.dec_lock_ref(req.last_node)
            return False
        if take < ext:
            req.fill_ids = req.fill_ids[: len(req.prefix_indices) + take]
            req.extend_input_len = take
            req.is_chunked = True
            self.new_chunked_req = req
            self._take(req, take, need)
            return False
        req.is_chunked = False
        self._take(req, ext, need)
        return True

    def _take(self, req: Req, ext: int, need: int) -> None:
        self.can_run.append(req)
        if req.req_pool_idx is None:
            self.free_req_slots -= 1
        self.rem_total_tokens -= need
        self.rem_input_tokens -= ext
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= ext


def shares_prefix_in_batch(req: Req, admitted: list[Req]) -> bool:
    if req.req_pool_idx is not None or len(req.prefix_indices) >= IN_BATCH_PREFIX_MIN:
        return False
    ids = req.fill_ids
    for other in admitted:
        n = min(len(ids), len(other.fill_ids), 4 * IN_BATCH_PREFIX_MIN)
        if n >= IN_BATCH_PREFIX_MIN and ids[:IN_BATCH_PREFIX_MIN] == other.fill_ids[:IN_BATCH_PREFIX_MIN]:
            # Cheap first check, then the real common length beyond what the tree has.
            common = next((i for i in range(n) if ids[i] != other.fill_ids[i]), n)
            if common - len(req.prefix_indices) >= IN_BATCH_PREFIX_MIN:
                return True
    return False
