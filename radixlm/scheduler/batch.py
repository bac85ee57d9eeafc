"""Req (one request's scheduling state) and ScheduleBatch (what runs in one step).

A ScheduleBatch allocates request and KV slots and turns itself into the model's
ForwardBatch; the model never sees a Req.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.sampling_params import SamplingParams

_EMPTY = torch.empty((0,), dtype=torch.int64)


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
    priority: Optional[int] = None
    input_text: Optional[str] = None
    arrival_time: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is (or, during this step, is being) in req_to_token[req_pool_idx, :len].
    fill_ids: list[int] = field(default_factory=list)
    prefix_indices: torch.Tensor = _EMPTY
    last_node: Any = None
    req_pool_idx: Optional[int] = None
    extend_input_len: int = 0
    is_chunked: bool = False  # this extend covers only part of fill_ids' new tokens
    finished_reason: Optional[dict] = None
    to_abort: bool = False
    cached_tokens: int = 0  # prompt tokens served from the radix cache (first prefill)
    prefilled: bool = False  # its first prefill finished
    input_logprobs_done: bool = False
    forward_passes: int = 0
    first_token_time: Optional[float] = None
    generator: Optional[torch.Generator] = None
    # Grammar matcher (radixlm.constrained); a Future while its grammar compiles.
    grammar: Any = None
    retracted: int = 0
    # Overlap scheduling: the future slot of the launched step whose token is not processed yet,
    # and where in fill_ids a later step put a placeholder for that token.
    future_slot: Optional[int] = None
    placeholder_pos: Optional[int] = None

    # Logprob increments not yet sent: [logprob, token_id] and per position top lists.
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    sent_output_len: int = 0
    # Used by policies.
    prefix_len_hint: int = 0

    def __post_init__(self):
        if self.sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.sampling_params.seed)

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def wants_prompt_logprobs(self) -> bool:
        return (
            self.return_logprob
            and not self.input_logprobs_done
            and 0 <= self.logprob_start_len < len(self.origin_input_ids)
        )

    def max_prefix_len(self) -> int:
        """Cached tokens this request may reuse: at least one token must be computed, and
        prompt logprobs need the logits from position logprob_start_len - 1 on."""
        limit = len(self.origin_input_ids) + len(self.output_ids) - 1
        if self.wants_prompt_logprobs():
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return limit

    def init_next_round_input(self, tree_cache) -> None:
        self.fill_ids = self.origin_input_ids + self.output_ids
        if self.req_pool_idx is None:  # a chunked request keeps its prefix between rounds
            key = self.fill_ids[: self.max_prefix_len()]
            self.prefix_indices, self.last_node = tree_cache.match_prefix(key)
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def logprob_first_position(self, prefix_len: int) -> Optional[int]:
        if not self.wants_prompt_logprobs():
            return None
        return max(self.logprob_start_len - 1, prefix_len)

    def check_finished(self, tokenizer, context_len: int) -> None:
        if self.finished_reason is not None:
            return
        sp = self.sampling_params
        if self.to_abort:
            self.finished_reason = {"type": "abort", "message": "aborted"}
            return
        if len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = {"type": "length", "length": sp.max_new_tokens}
            return
        last = self.output_ids[-1] if self.output_ids else None
        if self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = {"type": "stop", "matched": last}
            return
        if last is not None:
            if sp.stop_token_ids and last in sp.stop_token_ids:
                self.finished_reason = {"type": "stop", "matched": last}
                return
            if not sp.ignore_eos and last in self.eos_token_ids:
                self.finished_reason = {"type": "stop", "matched": last}
                return
            stops = sp.stop_strs
            if stops and tokenizer is not None:
                n = max(len(s) for s in stops) + 1
                tail = tokenizer.decode(self.output_ids[-n:], skip_special_tokens=sp.skip_special_tokens)
                for s in stops:
                    if s in tail:
                        self.finished_reason = {"type": "stop", "matched": s}
                        return
        if self.seqlen >= context_len:
            self.finished_reason = {"type": "length", "length": len(self.output_ids)}

    def banned_token_ids(self) -> list[int]:
        """EOS and stop tokens are banned until min_new_tokens outputs exist."""
        sp = self.sampling_params
        if len(self.output_ids) >= sp.min_new_tokens:
            return []
        banned = set(sp.stop_token_ids or [])
        if not sp.ignore_eos:
            banned |= self.eos_token_ids
        return sorted(banned)

    def reset_for_retract(self, retracted: bool = True) -> None:
        """Back to the waiting queue holding no slots (retraction, or a jump-forward)."""
        self.prefix_indices = _EMPTY
        self.last_node = None
        self.req_pool_idx = None
        self.fill_ids = []
        self.extend_input_len = 0
        self.is_chunked = False
        self.retracted += int(retracted)


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    # MIXED: the last num_decode reqs are running requests taking a decode step.
    num_decode: int = 0

    def batch_size(self) -> int:
        return len(self.reqs)

    @classmethod
    def mixed(cls, prefill: "ScheduleBatch", running: list[Req]) -> "ScheduleBatch":
        return cls(prefill.reqs + running, ForwardMode.MIXED, num_decode=len(running))

    @property
    def prefill_reqs(self) -> list[Req]:
        return self.reqs[: len(self.reqs) - self.num_decode]

    @property
    def decode_reqs(self) -> list[Req]:
        return self.reqs[len(self.reqs) - self.num_decode :]

    def prepare_for_extend(self, req_to_token_pool, token_to_kv_pool, tree_cache, device) -> ForwardBatch:
        reqs, decode = self.prefill_reqs, self.decode_reqs
        for r in reqs:
            if r.req_pool_idx is None:
                r.req_pool_idx = req_to_token_pool.alloc()
                assert r.req_pool_idx is not None, "admission must check request slots"
        total = sum(r.extend_input_len for r in reqs) + len(decode)
        out_loc = alloc_kv(token_to_kv_pool, tree_cache, total)
        assert out_loc is not None, "admission must check KV space"
        input_ids, positions, prefix_lens, ext_lens, seq_lens, lp_starts = [], [], [], [], [], []
        pt = 0
        for r in reqs:
            p, n = len(r.prefix_indices), r.extend_input_len
            row = req_to_token_pool.req_to_token[r.req_pool_idx]
            row[:p] = r.prefix_indices
            row[p : p + n] = out_loc[pt : pt + n]
            pt += n
            input_ids.extend(r.fill_ids[p : p + n])
            positions.extend(range(p, p + n))
            prefix_lens.append(p)
            ext_lens.append(n)
            seq_lens.append(p + n)
            lp_starts.append(r.logprob_first_position(p))
            r.forward_passes += 1
        for r in decode:  # as prepare_for_decode: one token after everything already in the KV
            p = len(r.fill_ids)
            req_to_token_pool.req_to_token[r.req_pool_idx, p] = out_loc[pt]
            pt += 1
            input_ids.append(r.output_ids[-1])
            r.fill_ids.append(r.output_ids[-1])
            positions.append(p)
            prefix_lens.append(p)
            ext_lens.append(1)
            seq_lens.append(p + 1)
            lp_starts.append(None)
            r.forward_passes += 1
        return self._forward_batch(
            self.forward_mode, input_ids, positions, seq_lens, out_loc, req_to_token_pool, token_to_kv_pool, device,
            extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=ext_lens,
            extend_logprob_start_lens_cpu=lp_starts,
            num_decode=len(decode),
        )

    def prepare_for_decode(self, req_to_token_pool, token_to_kv_pool, tree_cache, device) -> ForwardBatch:
        reqs = self.reqs
        out_loc = alloc_kv(token_to_kv_pool, tree_cache, len(reqs))
        assert out_loc is not None, "the scheduler must retract before decoding without room"
        # A token still being sampled by the step in flight is named by its future slot.
        input_ids = [r.output_ids[-1] if r.future_slot is None else -(r.future_slot + 1) for r in reqs]
        positions = [len(r.fill_ids) for r in reqs]
        for r, tok in zip(reqs, input_ids):
            if tok < 0:
                r.placeholder_pos = len(r.fill_ids)
            r.fill_ids.append(tok)
            r.forward_passes += 1
        fb = self._forward_batch(
            ForwardMode.DECODE, input_ids, positions, [p + 1 for p in positions], out_loc,
            req_to_token_pool, token_to_kv_pool, device,
        )
        req_to_token_pool.req_to_token[fb.req_pool_indices, fb.positions] = fb.out_cache_loc
        return fb

    def _forward_batch(
        self, mode, input_ids, positions, seq_lens, out_loc, req_to_token_pool, token_to_kv_pool, device, **extend
    ) -> ForwardBatch:
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(self.reqs),
            input_ids=as_tensor(input_ids),
            positions=as_tensor(positions),
            req_pool_indices=as_tensor([r.req_pool_idx for r in self.reqs]),
            seq_lens=as_tensor(seq_lens),
            out_cache_loc=out_loc.to(device),
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            seq_lens_cpu=seq_lens,
            **extend,
        )


def alloc_kv(token_to_kv_pool, tree_cache, need: int) -> Optional[torch.Tensor]:
    """Allocate `need` KV slots, evicting unlocked radix-tree leaves if the pool is short."""
    short = need - token_to_kv_pool.available_size()
    if short > 0:
        tree_cache.evict(short)
    return token_to_kv_pool.alloc(need)
