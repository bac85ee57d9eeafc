"""Decode micro-batches through a pipeline: a DECODE step's requests split into contiguous groups
that follow each other through the stages, so stage s + 1 runs group j while stage s runs group
j + 1 (GPipe within one step). With m groups over p stages a step takes about (m + p - 1) / m
stage-times instead of p: the bubble shrinks from (p - 1) / p of the time to (p - 1) / (m + p - 1).

Groups are at most --pp-max-micro-batch-size requests (default: p groups of even size). The
attention metadata of each group is planned just before it runs (a backend plans one batch at a
time); the last stage concatenates the groups' logits in row order, so sampling sees the step's
batch as one."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from radixlm.model.forward_batch import ForwardBatch


def micro_batch_count(batch_size: int, stages: int, max_size: Optional[int]) -> int:
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
        out.append(dataclasses.replace(
            fb, batch_size=b - a, input_ids=fb.input_ids[a:b], positions=fb.positions[a:b],
            req_pool_indices=fb.req_pool_indices[a:b], seq_lens=fb.seq_lens[a:b], out_cache_loc=fb.out_cache_loc[a:b],
            seq_lens_cpu=fb.seq_lens_cpu[a:b], attn_metadata=None, sampling_info=None))
    return out
