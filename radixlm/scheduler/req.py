"""Req: one request's scheduling state, and ReqStatus, the step of its lifecycle it is at.

Lifecycle (each status names the one container that holds the request: req_queues.py):

    arrival --> GRAMMAR_PENDING --> PREFETCHING --> WAITING --> PREFILLING (chunk k of n) --> RUNNING
                (its grammar         (its prefix      (queued      (admitted: row, lock,        (decoding)
                 compiles)            read from L3)    for admission) KV of its chunks)
    WAITING <-- RUNNING / PREFILLING: retraction (out of KV), jump-forward (re-prefills forced text)
    any --> FINISHING (finished while the step in flight still uses its KV) --> FINISHED
    any --> FINISHED (aborted, done, failed; its KV released, its last chunk sent)

KV state, in the request's row of ReqToTokenPool (`req_to_token[req_pool_idx]`):

    [0, cache_protected_len)                  the radix tree's slots, locked through `last_node`
    [cache_protected_len, kv_allocated_len)   slots this request owns (freed or handed to the tree
                                              by the cache manager, never by anyone else)
    [0, kv_committed_len)                     positions whose K/V a finished forward wrote
                                              (kv_committed_len <= kv_allocated_len; the gap is a
                                              step in flight)

Only the cache manager (cache_manager.py) moves KV between a request and the tree, and only
ScheduleBatch allocates a step's slots. A request in the waiting queue holds nothing: no row, no
lock, all three lengths 0. Token ids are `origin_input_ids + output_ids`; the K/V of the last
output token is computed by the step that samples the token after it.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.ipc import (
    FinishAbort,
    FinishLength,
    FinishReason,
    FinishStop,
    TokenizedGenerateReqInput,
)
from radixlm.mm_inputs import MultimodalInputs
from radixlm.sampling_params import SamplingParams, brief_repr
from radixlm.stop_match import STOP_REGEX_BUDGET_S, STOP_REGEX_WINDOW, StopRegexTimeout, first_match

logger = logging.getLogger(__name__)


class ReqStatus(Enum):
    NEW = "new"  # built, not queued yet
    GRAMMAR_PENDING = "grammar-pending"
    PREFETCHING = "prefetching"
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHING = "finishing"
    FINISHED = "finished"
    # PD disaggregation (pd/decode.py, pd/prefill.py): decode side, waiting for the prefill server's
    # bootstrap and for KV room (holds nothing); holding reserved slots while the KV arrives, or
    # (prefill side) holding the KV while it is sent.
    KV_BOOTSTRAP = "kv-bootstrap"
    KV_TRANSFER = "kv-transfer"


@dataclass(eq=False)
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    priority: int | None = None
    input_text: str | None = None
    # The prefix cache's namespace of this request's KV (PrefixKey); None: the common one.
    cache_namespace: str | None = None
    lora_id: str | None = None  # the LoRA adapter's uid (None: the base model)
    mm_inputs: MultimodalInputs | None = (
        None  # images: their spans hold pad values (radixlm/mm_inputs.py)
    )
    bootstrap: Any = None  # PD disaggregation: its ipc.BootstrapInfo (the transfer's room)
    arrival_time: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    # KV state (module docstring).
    req_pool_idx: int | None = None
    last_node: Any = None  # the tree node locked for this request; None: no lock held
    cache_protected_len: int = 0
    kv_allocated_len: int = 0
    kv_committed_len: int = 0
    # A hybrid model (scheduler/kv/state_tracker.py): tokens its row's state has absorbed in the
    # steps launched so far, and the snapshot slots a launched step fills for it: (position, slot).
    state_len: int = 0
    state_tracks: list = field(default_factory=list)
    # Speculative decoding: the draft slots its verify step in flight keeps node states in.
    state_draft_slots: list = field(default_factory=list)
    # Where its tokens leave the tree's KV past its match's snapshot (a prefix another request
    # shares): its prefill keeps a snapshot there too. None: nowhere worth one.
    state_branch: int | None = None
    # A model with sliding-window layers (scheduler/kv/window_tracker.py): own positions below
    # swa_trimmed_len gave back their windowed-layer KV; swa_pins: the positions [start, end) of
    # the tree's slots this request's window reads (pinned), or None.
    swa_trimmed_len: int = 0
    swa_pins: tuple[int, int] | None = None

    status: ReqStatus = ReqStatus.NEW
    finished_reason: FinishReason | None = None
    to_abort: bool = False
    cached_tokens: int = 0  # prompt tokens served from the radix cache (first prefill)
    forward_passes: int = 0
    prefill_chunks: int = (
        0  # chunks of its current prefill computed so far (PREFILLING: chunk k of n)
    )
    # Speculative decoding: verify steps that carried a draft of this request, drafts accepted.
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    first_token_time: float | None = None
    generator: torch.Generator | None = None
    # Grammar matcher (radixlm.constrained); a Future while its grammar compiles.
    grammar: Any = None
    retracted: int = 0
    # Hierarchical cache: the L3 read of this request's prefix it waits for
    # (cache/hicache_io.Prefetch).
    prefetch: Any = None
    # Overlap scheduling: where the launched, unprocessed decode step stores this request's token.
    future_slot: int | None = None
    # An embedding model's request (--is-embedding; model/pooler.py): whether its pooling reads
    # every prompt token (no cached prefix then), its partials folded so far, the finished vector.
    pool_all_tokens: bool = False
    pooled: torch.Tensor | None = None
    embedding: list[float] | None = None

    # Prompt logprobs: the next prompt position whose logprob is still owed (chunks, retraction
    # and re-prefill never compute one twice).
    logprob_pos: int = 0
    # Logprob increments not yet sent: [logprob, token_id] and per position top lists.
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    sent_output_len: int = 0

    @classmethod
    def from_input(cls, recv: TokenizedGenerateReqInput, eos_token_ids: frozenset[int]) -> Req:
        return cls(
            rid=recv.rid,
            origin_input_ids=list(recv.input_ids),
            sampling_params=recv.sampling_params,
            eos_token_ids=eos_token_ids,
            return_logprob=recv.return_logprob,
            logprob_start_len=recv.logprob_start_len,
            top_logprobs_num=recv.top_logprobs_num,
            stream=recv.stream,
            priority=recv.priority,
            input_text=recv.input_text,
            cache_namespace=recv.cache_namespace,
            lora_id=recv.lora_id,
            mm_inputs=recv.mm_inputs,
            bootstrap=recv.bootstrap,
        )

    def __post_init__(self):
        if self.sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.sampling_params.seed)
        n = len(self.origin_input_ids)
        self.logprob_pos = (
            self.logprob_start_len if self.return_logprob and self.logprob_start_len >= 0 else n
        )

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def text_input_ids(self) -> list[int]:
        """The prompt without its image spans' pad values (what penalties over the prompt read)."""
        ids = self.origin_input_ids
        if self.mm_inputs is None:
            return ids
        inside = {p for it in self.mm_inputs.items for p in range(it.offset, it.end)}
        return [t for p, t in enumerate(ids) if p not in inside]

    def prefix_key(self, length: int) -> PrefixKey:
        """The prefix cache's key of this request's first `length` tokens."""
        return PrefixKey(self.all_ids()[:length], self.cache_namespace)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    def wants_prompt_logprobs(self) -> bool:
        return self.logprob_pos < len(self.origin_input_ids)

    def max_prefix_len(self) -> int:
        """Cached tokens this request may reuse: at least one token must be computed, and the
        prompt logprobs still owed need the logits from position logprob_pos - 1 on."""
        limit = self.seqlen - 1
        if self.pool_all_tokens:  # mean / cls pooling: the hidden state of every token is needed
            return 0
        if self.wants_prompt_logprobs():
            limit = min(limit, max(self.logprob_pos - 1, 0))
        return limit

    def abort(self, message: str = "aborted", status_code: int | None = None) -> None:
        if self.finished_reason is None:
            self.finished_reason = FinishAbort(message, status_code)

    def check_finished(self, tokenizer, context_len: int) -> None:
        if self.finished_reason is not None:
            return
        sp = self.sampling_params
        if self.to_abort:
            self.abort()
            return
        if len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = FinishLength(sp.max_new_tokens)
            return
        last = self.output_ids[-1] if self.output_ids else None
        if self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = FinishStop(last)
            return
        if last is not None:
            if sp.stop_token_ids and last in sp.stop_token_ids:
                self.finished_reason = FinishStop(last)
                return
            if not sp.ignore_eos and last in self.eos_token_ids:
                self.finished_reason = FinishStop(last)
                return
            stops = sp.stop_strs
            if stops and tokenizer is not None:
                n = max(len(s) for s in stops) + 1
                tail = tokenizer.decode(
                    self.output_ids[-n:], skip_special_tokens=sp.skip_special_tokens
                )
                for s in stops:
                    if s in tail:
                        self.finished_reason = FinishStop(s)
                        return
            if sp.stop_regex and tokenizer is not None and self._check_stop_regex(tokenizer):
                return
        if self.seqlen >= context_len:
            self.finished_reason = FinishLength(len(self.output_ids))

    def _check_stop_regex(self, tokenizer) -> bool:
        """Finish on a stop_regex match in the output's last characters (stop_match.py): each token
        is at least one character, so a match of w characters lies in the last w + 1 tokens. A
        search past its time budget ends this request with a 400, never the scheduler's loop."""
        sp = self.sampling_params
        tail = tokenizer.decode(
            self.output_ids[-(sp.stop_regex_window + 1) :],
            skip_special_tokens=sp.skip_special_tokens,
        )[-STOP_REGEX_WINDOW:]
        try:
            hit = first_match(sp.stop_regex_list, tail)
        except StopRegexTimeout as e:
            logger.warning(
                "request %s: stop_regex %s timed out after %d output tokens",
                self.rid,
                brief_repr(e.pattern),
                len(self.output_ids),
            )
            self.abort(
                f"sampling_params.stop_regex {brief_repr(e.pattern)} took longer than"
                f" {STOP_REGEX_BUDGET_S * 1000:.0f} ms to search the last {len(tail)} characters of"
                " the output; the request was stopped (simplify the pattern)",
                400,
            )
            return True
        if hit is not None:
            self.finished_reason = FinishStop(hit[0], matched_regex=True)
            return True
        return False

    def banned_token_ids(self) -> list[int]:
        """EOS and stop tokens are banned until min_new_tokens outputs exist."""
        sp = self.sampling_params
        if len(self.output_ids) >= sp.min_new_tokens:
            return []
        banned = set(sp.stop_token_ids or [])
        if not sp.ignore_eos:
            banned |= self.eos_token_ids
        return sorted(banned)
