"""Micro-batches through a pipeline, within one step (GPipe): stage s + 1 runs part j while stage s
runs part j + 1. With m parts over p stages a step takes about (m + p - 1) / m stage-times instead
of p: the bubble shrinks from (p - 1) / p of the time to (p - 1) / (m + p - 1).

- A DECODE step's requests split into contiguous groups of at most --pp-max-micro-batch-size
  (default: p groups of even size); the last stage concatenates their logits in row order, so
  sampling sees the step's batch as one.
- A prefill of one request (a long prompt, or one chunk of it under chunked prefill) splits its new
  tokens into p consecutive pieces: piece j is an extend after the pieces before it, whose KV this
  stage wrote just before, so piece j + 1 enters stage 0 while piece j is in stage 1. The last
  piece's last token gives the logits.
The attention metadata of each part is planned just before it runs (a backend plans one batch at a
time)."""

from __future__ import annotations

import dataclasses
import math

import torch

from radixlm.model.forward_batch import ForwardBatch, ForwardMode

MIN_PIECE_TOKENS = (
    8  # a shorter prefill piece costs more in per-part overhead than the overlap saves
)


def plan(fb: ForwardBatch, stages: int, max_size: int | None) -> list[ForwardBatch] | None:
    """fb's parts, or None: run it whole (a mixed or verify batch, several prefills, prompt
    logprobs)."""
    if fb.forward_mode.is_decode():
        parts = micro_batch_count(fb.batch_size, stages, max_size)
        return split_decode(fb, parts) if parts > 1 else None
    single = fb.forward_mode == ForwardMode.EXTEND and fb.batch_size == 1
    # Gemma 3's image tokens attend each other both ways: a piece must not cut an image.
    whole_images = (
        bool(fb.mm_inputs) and fb.mm_inputs[0] is not None and fb.mm_inputs[0].bidirectional
    )
    if (
        single
        and not whole_images
        and not any(fb.extend_logprob_start_lens_cpu or ())
        and fb.num_tokens >= stages * MIN_PIECE_TOKENS
    ):
        return split_extend(fb, stages)
    return None


def micro_batch_count(batch_size: int, stages: int, max_size: int | None) -> int:
    if max_size:
        return math.ceil(batch_size / max_size)
    return min(stages, batch_size)


def split_decode(fb: ForwardBatch, parts: int) -> list[ForwardBatch]:
    """fb's rows in `parts` contiguous groups (sizes differ by at most one), each a DECODE batch
    of its own (one token per request, so tokens and rows slice alike)."""
    bs = fb.batch_size
    bounds = [bs * i // parts for i in range(parts + 1)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out.append(
            dataclasses.replace(
                fb,
                batch_size=b - a,
                input_ids=fb.input_ids[a:b],
                positions=fb.positions[a:b],
                req_pool_indices=fb.req_pool_indices[a:b],
                seq_lens=fb.seq_lens[a:b],
                out_cache_loc=fb.out_cache_loc[a:b],
                seq_lens_cpu=fb.seq_lens_cpu[a:b],
                attn_metadata=None,
                sampling_info=None,
            )
        )
    return out


def split_extend(fb: ForwardBatch, parts: int) -> list[ForwardBatch]:
    """One request's new tokens in `parts` consecutive pieces, each an extend after the ones
    before."""
    n, prefix = fb.num_tokens, fb.extend_prefix_lens_cpu[0]
    bounds = [n * i // parts for i in range(parts + 1)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out.append(
            dataclasses.replace(
                fb,
                input_ids=fb.input_ids[a:b],
                positions=fb.positions[a:b],
                out_cache_loc=fb.out_cache_loc[a:b],
                seq_lens=torch.full_like(fb.seq_lens, prefix + b),
                seq_lens_cpu=[prefix + b],
                extend_prefix_lens_cpu=[prefix + a],
                extend_seq_lens_cpu=[b - a],
                extend_logprob_start_lens_cpu=[None],
                attn_metadata=None,
                sampling_info=None,
            )
        )
    return out
