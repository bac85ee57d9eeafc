"""A state layer's recurrence over a verify step's draft trees, each node from its parent's state.

A verify step (TARGET_VERIFY) feeds each request its next input (the root) and its draft tree's
nodes. Run as one extend, a state layer would fold every node into the request's state, rejected
ones and other branches' included. Instead (SGLang keeps per-draft-token states the same way), with
ForwardBatch.state_drafts the recurrence runs level by level:

    level 0   every request's root, on its own row's state (as a decode step)
    level d   every node at depth d: its parent's state (the row's for the root's children, else the
              parent's draft slot) is copied into the node's draft slot, then advanced by the
              node's token there

so each draft slot ends holding the state after its node's path, exactly what decode steps along
that path would have left (a level is a decode-shaped call: one token per state). The scheduler then
copies the last accepted node's slot into the row (scheduler/kv/state_tracker.py), and a rejected
draft never touches it. Cost: one call of the recurrence per tree level instead of one per layer,
and one state copy per draft node.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.model.forward_batch import ForwardBatch

Recurrence = Callable[[list[torch.Tensor], torch.Tensor, list[int]], torch.Tensor]


def run_draft_levels(
    fb: ForwardBatch, state_layer_id: int, inputs: list[torch.Tensor], fn: Recurrence
) -> torch.Tensor:
    rows = fb.req_pool_indices.tolist()
    lens = list(fb.extend_seq_lens_cpu)
    drafts = fb.state_drafts
    assert drafts is not None and len(drafts) == len(rows) == len(lens)
    # level -> (token index, state slot, the slot its state starts from (None: in place))
    levels: list[list[tuple[int, int, int | None]]] = [[]]
    pos = 0
    for row, n, (slots, parents) in zip(rows, lens, drafts):
        assert n == 1 + len(slots) == 1 + len(parents), (n, len(slots), len(parents))
        levels[0].append((pos, row, None))
        depth = []
        for j, p in enumerate(parents):
            depth.append(1 if p < 0 else depth[p] + 1)
            if depth[j] == len(levels):
                levels.append([])
            levels[depth[j]].append((pos + 1 + j, slots[j], row if p < 0 else slots[p]))
        pos += n
    device = inputs[0].device
    as_index = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)
    out = None
    for level in levels:
        src = [s for _, _, s in level if s is not None]
        if src:  # every node at this level starts from its parent's state (level 0: none)
            dst = [d for _, d, s in level if s is not None]
            fb.state_pool.copy_layer(state_layer_id, as_index(src), as_index(dst))
        index = as_index([t for t, _, _ in level])
        part = fn([x[index] for x in inputs], as_index([d for _, d, _ in level]), [1] * len(level))
        if out is None:
            out = part.new_empty((pos, *part.shape[1:]))
        out[index] = part
    return out
