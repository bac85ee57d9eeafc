"""Running a state layer's recurrence over a batch, with snapshots taken inside it.

A forward may be asked to keep a request's state after some of its new tokens
(ForwardBatch.state_tracks: the end of its prompt, every --mamba-track-interval tokens): the
recurrence then runs in rounds, round r taking each request's r-th segment between such points,
and each point's state is copied to its snapshot slot when its round is done. Without tracks (every
decode step, most extends) it is one call over the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.draft_states import run_draft_levels

# (per-token inputs of a sub-batch, their state rows, their new tokens per request) -> outputs
Recurrence = Callable[[list[torch.Tensor], torch.Tensor, list[int]], torch.Tensor]


def request_lens(fb: ForwardBatch) -> list[int]:
    """New tokens per request in this forward (1 each in a decode step)."""
    if fb.forward_mode.is_extend():
        return list(fb.extend_seq_lens_cpu)
    return [1] * fb.batch_size


def run_state_layer(
    fb: ForwardBatch, state_layer_id: int, inputs: list[torch.Tensor], fn: Recurrence
) -> torch.Tensor:
    if fb.state_drafts is not None:
        return run_draft_levels(fb, state_layer_id, inputs, fn)
    rows = fb.req_pool_indices
    lens = request_lens(fb)
    tracks = fb.state_tracks
    if not tracks or not any(tracks):
        return fn(inputs, rows, lens)
    # Each request's segments: boundaries at its track points and its end.
    segs = []
    pos = 0
    for i, n in enumerate(lens):
        cuts = sorted({t for t, _ in tracks[i] if 0 < t < n} | {n})
        bounds = [0, *cuts]
        segs.append([(pos + a, pos + b, b) for a, b in zip(bounds, bounds[1:])])
        pos += n
    out = None
    for r in range(max(len(s) for s in segs)):
        idx, members, sub_lens = [], [], []
        for i, s in enumerate(segs):
            if r < len(s):
                a, b, _ = s[r]
                idx.append(torch.arange(a, b))
                sub_lens.append(b - a)
                members.append(i)
        index = torch.cat(idx).to(inputs[0].device)
        part = fn([x[index] for x in inputs], rows[members], sub_lens)
        if out is None:
            out = part.new_empty((pos, *part.shape[1:]))
        out[index] = part
        src, dst = [], []
        for i in members:
            end = segs[i][r][2]
            for t, slot in tracks[i]:
                if t == end:
                    src.append(int(rows[i]))
                    dst.append(slot)
        if src:
            as_index = lambda xs: torch.tensor(xs, dtype=torch.int64, device=rows.device)
            fb.state_pool.copy_layer(state_layer_id, as_index(src), as_index(dst))
    return out
