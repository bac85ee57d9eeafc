"""Admission: which waiting requests (and how much of each) the next extend step takes.

PrefillAdder admits requests in the order the policy gave while free + evictable KV covers
their new tokens plus a reserve for the future tokens of everything running, within the
step's input-token budget; a prompt longer than the chunk budget gets a first chunk only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixlm.scheduler.batch import PrefillChunk
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req import Req

# A request whose uncached prefix shares at least this many tokens with a request already in
# the batch waits a round (SGLang's in-batch prefix caching check).
IN_BATCH_PREFIX_MIN = 32
# Cap on the decode tokens reserved for one running request.
CLIP_MAX_NEW_TOKENS = 4096


@dataclass
class NewTokenRatio:
    """The share of each running request's remaining max_new_tokens that admission reserves
    (SGLang's new_token_ratio): high after a retraction, decaying by `decay` per decode step to
    `minimum`."""

    initial: float
    minimum: float
    decay: float
    value: float = -1.0

    def __post_init__(self):
        self.value = self.initial

    def step(self) -> None:
        self.value = max(self.minimum, self.value - self.decay)

    def after_retraction(self) -> None:
        self.value = 1.0


def reserve_for(req: Req, ratio: float) -> int:
    """KV tokens held back for a running request's future outputs."""
    left = req.sampling_params.max_new_tokens - len(req.output_ids)
    return int(max(0, min(left, CLIP_MAX_NEW_TOKENS)) * ratio)


@dataclass
class PrefillAdder:
    cache: CacheManager
    rem_total_tokens: int  # free + evictable - reserve of running requests
    rem_input_tokens: int  # max_prefill_tokens left in this batch
    rem_chunk_tokens: int | None  # chunked_prefill_size left, None = no chunking
    new_token_ratio: float
    free_req_slots: int
    nothing_running: bool
    chunks: list[PrefillChunk] = field(default_factory=list)
    new_chunked_req: Req | None = None  # admitted for a first (or next) chunk only

    def can_admit_more(self) -> bool:
        """False when no request can be admitted whatever its prefix (ordering would be wasted)."""
        chunk_left = self.rem_chunk_tokens is None or self.rem_chunk_tokens > 0
        return (
            self.new_chunked_req is None
            and self.rem_total_tokens > 0
            and self.rem_input_tokens > 0
            and chunk_left
            and self.free_req_slots > 0
        )

    def add_chunked_req(self, req: Req) -> bool:
        """The next chunk of the request being prefilled in chunks (it holds its row and lock)."""
        take, need = self._take_len(req.seqlen - req.kv_committed_len, req)
        if take <= 0:
            return False
        self._add(req, take, need)
        return True

    def add_one_req(self, req: Req) -> bool:
        """Admit a waiting request (maybe only a first chunk). False: admission stops here."""
        if self.free_req_slots <= 0:
            return False
        indices, node = self.cache.match(req)
        # Locking the prefix first: what it pins is no longer evictable budget.
        self.rem_total_tokens += self.cache.lock(node)
        take, need = self._take_len(req.seqlen - len(indices), req)
        if take <= 0:
            self.rem_total_tokens += self.cache.unlock(node)
            return False
        self.cache.assign(req, indices, node)
        self.free_req_slots -= 1
        self._add(req, take, need)
        return self.new_chunked_req is None

    def _take_len(self, ext: int, req: Req) -> tuple[int, int]:
        """How many of req's `ext` new tokens this step computes (0: none), and the KV budget
        that takes (the reserve for its outputs included when the chunk is its last)."""
        chunking = self.rem_chunk_tokens is not None
        limit = (
            min(self.rem_chunk_tokens, self.rem_input_tokens) if chunking else self.rem_input_tokens
        )
        if not chunking and not self.chunks:
            limit = ext  # without chunking the first prompt always fits the input budget
        take = min(ext, limit)
        if take < ext and not chunking:
            return 0, 0
        take = whole_spans(req, ext, take)
        need = take if take < ext else take + reserve_for(req, self.new_token_ratio)
        first = self.nothing_running and not self.chunks
        if need > self.rem_total_tokens:
            # Progress first: with nothing running, admit what fits (a chunk, or the whole prompt).
            if first and chunking:
                fits = min(take, self.rem_total_tokens)
                kept = whole_spans(req, ext, fits)  # an image span that does not fit waits
                take = need = kept if kept <= fits else 0
            elif not (first and ext <= self.rem_total_tokens):
                take = 0
        return max(take, 0), need

    def _add(self, req: Req, take: int, need: int) -> None:
        chunk = PrefillChunk.plan(req, take)
        if not chunk.is_last:
            self.new_chunked_req = req
        self.chunks.append(chunk)
        self.rem_total_tokens -= need
        self.rem_input_tokens -= take
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= take


def whole_spans(req: Req, ext: int, take: int) -> int:
    """`take` of req's last `ext` tokens, moved so that the chunk does not end inside an image span
    whose tokens attend each other both ways (Gemma 3: its queries need the whole image's keys):
    back to the span's start, or on to its end when the chunk starts inside or at it."""
    mm = req.mm_inputs
    if take >= ext or take <= 0 or mm is None or not mm.bidirectional:
        return take
    start = req.seqlen - ext
    end = start + take
    for it in mm.items:
        if it.offset < end < it.end:
            return it.offset - start if it.offset > start else it.end - start
    return take


def shares_prefix_in_batch(req: Req, admitted: list[Req], prefix_len: Callable[[], int]) -> bool:
    """Whether req's uncached prefix overlaps a request already in the batch by at least
    IN_BATCH_PREFIX_MIN tokens (it should hit the cache next round instead of computing it twice).
    prefix_len: req's cached prefix length, asked for only when the cheap check passes."""
    ids = req.all_ids()
    head = ids[:IN_BATCH_PREFIX_MIN]
    for other in admitted:
        oids = other.all_ids()
        n = min(len(ids), len(oids), 4 * IN_BATCH_PREFIX_MIN)
        if n >= IN_BATCH_PREFIX_MIN and oids[:IN_BATCH_PREFIX_MIN] == head:
            common = next((i for i in range(n) if ids[i] != oids[i]), n)
            if common - prefix_len() >= IN_BATCH_PREFIX_MIN:
                return True
    return False
