"""PrefillChunk (one request's part of an extend step) and ScheduleBatch (what runs in one step).

A ScheduleBatch allocates the step's KV slots and turns itself into the ModelWorkerBatch the model
runner takes; the model never sees a Req.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.forward_batch import ForwardMode
from radixlm.model.host_copy import to_device
from radixlm.model.layers.sampler import SamplingRow
from radixlm.scheduler.req import Req
from radixlm.speculative.draft_tree import DraftTree

if TYPE_CHECKING:
    from radixlm.scheduler.kv.cache_manager import CacheManager


@dataclass(frozen=True)
class PrefillChunk:
    """Compute the K/V of `req`'s tokens [start, start + length), after the KV of [0, start) that
    its row already holds (cached, or earlier chunks). Planned by admission, never changed after."""

    req: Req
    start: int
    length: int
    # The chunk reaches the end of the request's tokens: its last logits give the next token.
    # A request whose chunk is not the last cannot decode; it stays PREFILLING between its chunks.
    is_last: bool
    # Prompt logprobs: the first position whose logits row the forward returns (None: only the
    # last).
    logprob_start: int | None

    @classmethod
    def plan(cls, req: Req, length: int) -> PrefillChunk:
        start = req.kv_committed_len
        assert req.kv_allocated_len == start and 0 < length <= req.seqlen - start, (
            req.rid,
            start,
            length,
        )
        end = start + length
        logprob_start = None
        if req.wants_prompt_logprobs():
            # Row p predicts token p + 1: the next owed logprob needs row logprob_pos - 1.
            first = max(req.logprob_pos - 1, start)
            if first < end:
                logprob_start = first
        return cls(req, start, length, end == req.seqlen, logprob_start)

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def samples(self) -> bool:
        """Whether this step's sampled token is the request's (a middle chunk's is dropped)."""
        return self.is_last


@dataclass
class ScheduleBatch:
    forward_mode: ForwardMode
    chunks: list[PrefillChunk] = field(default_factory=list)  # EXTEND / MIXED
    decode_reqs: list[Req] = field(
        default_factory=list
    )  # DECODE / MIXED (after the chunks) / TARGET_VERIFY
    # TARGET_VERIFY: per decode request, the draft tree verified after its next input (maybe empty).
    drafts: list[DraftTree] = field(default_factory=list)

    def __post_init__(self):
        assert self.chunks or self.decode_reqs, "an empty batch never runs"
        if self.forward_mode == ForwardMode.EXTEND:
            assert not self.decode_reqs
        elif self.forward_mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
            assert not self.chunks
        assert len(self.drafts) == (len(self.decode_reqs) if self.forward_mode.is_verify() else 0)

    def verify_rows(self, i: int) -> int:
        """TARGET_VERIFY: the forward's row of decode request i's root (its next input); its tree's
        node j is row verify_rows(i) + 1 + j."""
        return i + sum(len(d) for d in self.drafts[:i])

    @property
    def reqs(self) -> list[Req]:
        return [c.req for c in self.chunks] + self.decode_reqs

    def batch_size(self) -> int:
        return len(self.chunks) + len(self.decode_reqs)

    @property
    def num_decode(self) -> int:
        return len(self.decode_reqs)

    def sampling_rows(self) -> list[bool]:
        """Per row: whether its sampled token is kept (and so may draw from its seeded generator).
        A drafted request's tokens come from the verifier instead."""
        if self.forward_mode.is_verify():
            return [not d for d in self.drafts]
        return [c.samples for c in self.chunks] + [True] * len(self.decode_reqs)

    def sampling(self) -> list[SamplingRow]:
        """Per request, what the sampler needs this step."""
        return [
            SamplingRow(
                r.sampling_params,
                r.output_ids,
                r.text_input_ids(),
                r.generator if keep else None,
                r.banned_token_ids(),
            )
            for r, keep in zip(self.reqs, self.sampling_rows())
        ]

    def prepare(self, cache_manager: CacheManager) -> ModelWorkerBatch:
        """Allocate this step's KV slots, write them into the requests' rows, and describe the step.
        A decode input whose token the step in flight is still sampling is named by its future
        slot (-(slot + 1)), resolved on the worker (overlap.py)."""
        total = (
            sum(c.length for c in self.chunks) + len(self.decode_reqs) + sum(map(len, self.drafts))
        )
        cache_manager.windows.trim(self.reqs)  # before the allocation: what windows left
        out_loc = cache_manager.alloc_kv(total)
        assert out_loc is not None, "admission and retraction must leave room for the step"
        r2t = cache_manager.req_to_token_pool.req_to_token
        input_ids, positions, seq_lens, prefix_lens, ext_lens, lp_starts = [], [], [], [], [], []
        pt = 0
        for c in self.chunks:
            r = c.req
            assert r.kv_allocated_len == c.start == r.kv_committed_len, (
                r.rid,
                r.kv_allocated_len,
                c.start,
            )
            r2t[r.req_pool_idx, c.start : c.end] = out_loc[pt : pt + c.length]
            pt += c.length
            r.kv_allocated_len = c.end
            r.forward_passes += 1
            input_ids.extend(r.all_ids()[c.start : c.end])
            positions.extend(range(c.start, c.end))
            prefix_lens.append(c.start)
            ext_lens.append(c.length)
            seq_lens.append(c.end)
            lp_starts.append(c.logprob_start)
        tree_parents = None
        if self.forward_mode.is_verify():
            self._prepare_verify(
                r2t, out_loc, input_ids, positions, prefix_lens, ext_lens, seq_lens, lp_starts
            )
            if not all(
                d.is_chain for d in self.drafts
            ):  # chains need no mask: causal attention is theirs
                tree_parents = [[-1] + [p + 1 for p in d.parents] for d in self.drafts]
        else:
            self._prepare_decode(
                r2t, out_loc[pt:], input_ids, positions, prefix_lens, ext_lens, seq_lens, lp_starts
            )
        state_copies, state_tracks, state_drafts = cache_manager.states.plan_step(
            self.chunks, self.decode_reqs, self.drafts if self.forward_mode.is_verify() else None
        )
        return ModelWorkerBatch(
            self.forward_mode,
            input_ids,
            positions,
            [r.req_pool_idx for r in self.reqs],
            seq_lens,
            out_loc,
            extend_prefix_lens=prefix_lens,
            extend_seq_lens=ext_lens,
            extend_logprob_start_lens=lp_starts,
            num_decode=len(self.decode_reqs) if self.forward_mode.is_mixed() else 0,
            sampling=self.sampling(),
            lora_ids=[r.lora_id for r in self.reqs],
            mm_inputs=(
                [r.mm_inputs for r in self.reqs] if any(r.mm_inputs for r in self.reqs) else []
            ),
            tree_parents=tree_parents,
            state_copies=state_copies,
            state_tracks=state_tracks,
            state_drafts=state_drafts,
        )

    @staticmethod
    def _next_input(r: Req) -> int:
        """The token a decode step feeds for r: its last one, or the future slot of the step in
        flight."""
        p = r.kv_allocated_len
        n_in, n_out = len(r.origin_input_ids), len(r.output_ids)
        if p < n_in + n_out:
            return r.origin_input_ids[p] if p < n_in else r.output_ids[p - n_in]
        assert p == n_in + n_out and r.future_slot is not None, (r.rid, p, n_in + n_out)
        return -(r.future_slot + 1)

    def _prepare_decode(
        self, r2t, out_loc, input_ids, positions, prefix_lens, ext_lens, seq_lens, lp_starts
    ):
        decode_pos = []
        for r in self.decode_reqs:
            p = r.kv_allocated_len
            input_ids.append(self._next_input(r))
            r.kv_allocated_len = p + 1
            r.forward_passes += 1
            decode_pos.append(p)
        if self.decode_reqs:
            rows = to_device([r.req_pool_idx for r in self.decode_reqs], torch.int64, r2t.device)
            pos = to_device(decode_pos, torch.int64, r2t.device)
            r2t[rows, pos] = to_device(out_loc, torch.int64, r2t.device)
            positions.extend(decode_pos)
            seq_lens.extend(p + 1 for p in decode_pos)
            prefix_lens.extend(decode_pos)
            ext_lens.extend([1] * len(decode_pos))
            lp_starts.extend([None] * len(decode_pos))

    def _prepare_verify(
        self, r2t, out_loc, input_ids, positions, prefix_lens, ext_lens, seq_lens, lp_starts
    ):
        """Each request: its next input and its draft tree's nodes, as an extend after its context
        (node j at column p + 1 + j, position p + its depth: the tree mask, model/tree_mask.py, has
        it attend its ancestors only); a drafted request gets every row's logits back (lp_start at
        its first new position)."""
        pt = 0
        for r, draft in zip(self.decode_reqs, self.drafts):
            p, n = r.kv_allocated_len, 1 + len(draft)
            tok = self._next_input(r)
            assert tok >= 0, "a verify step never follows a step in flight"
            r2t[r.req_pool_idx, p : p + n] = to_device(
                out_loc[pt : pt + n], torch.int64, r2t.device
            )
            pt += n
            r.kv_allocated_len = p + n
            r.forward_passes += 1
            input_ids.append(tok)
            input_ids.extend(draft.tokens)
            positions.append(p)
            positions.extend(p + d for d in draft.depths)
            prefix_lens.append(p)
            ext_lens.append(n)
            seq_lens.append(p + n)
            lp_starts.append(p if draft else None)
