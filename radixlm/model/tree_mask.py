"""TreeMask: which of a TARGET_VERIFY batch's new tokens each new token attends (a speculative
draft tree's attention mask; SGLang's `spec_info.custom_mask` with its `mask_indptr`).

A verify step lays each request's draft tree out as an extend: its new tokens are the root (the
request's next input) and then the tree's nodes in topological order, written at consecutive
columns of its req_to_token row after its prefix. Every new token attends the whole prefix; among
the new tokens it attends only its own ancestors and itself. Its position (RoPE) is the prefix
length plus its depth, so a node sees exactly what a decode step at its place on its path would.

The batch carries that as one [n_b, n_b] boolean block per request b (n_b its new tokens; row r,
column c: token r attends new token c), flattened row-major into one device tensor at offsets
`mask_indptr` (a GPU kernel reads mask[mask_indptr[b] + r * n_b + c]); a chain's block is the
causal one. The host copies (`blocks_cpu`, `parents_cpu`) serve backends that plan on the CPU:
the native backend turns each masked row into its own key list (prefix + ancestors), the torch
backend puts a block into its SDPA mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.model.host_copy import to_device

NO_PARENT = -1  # a new token whose parent is the prefix (a request's first new token)


@dataclass
class TreeMask:
    custom_mask: torch.Tensor  # bool [sum_b n_b * n_b] on the model's device
    mask_indptr: torch.Tensor  # int64 [bs + 1] on the model's device
    blocks_cpu: list[torch.Tensor]  # per request, its bool [n_b, n_b] block on the host
    # Per request, the parent of each new token among its new tokens (NO_PARENT: the first).
    parents_cpu: list[tuple[int, ...]]

    @classmethod
    def from_parents(cls, parents: Sequence[Sequence[int]], device: torch.device) -> TreeMask:
        """parents[b][r]: new token r's parent among request b's new tokens, below r (NO_PARENT for
        the first only: one root per request)."""
        blocks = [ancestor_block(p) for p in parents]
        sizes = [b.shape[0] ** 2 for b in blocks]
        indptr = torch.zeros(len(blocks) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0, out=indptr[1:])
        flat = (
            torch.cat([b.reshape(-1) for b in blocks])
            if blocks
            else torch.zeros(0, dtype=torch.bool)
        )
        return cls(
            to_device(flat, torch.bool, device),
            to_device(indptr, torch.int64, device),
            blocks,
            [tuple(p) for p in parents],
        )

    def is_causal(self, b: int) -> bool:
        """Request b's new tokens form a chain (its block is the causal one)."""
        return all(p == r - 1 for r, p in enumerate(self.parents_cpu[b]))

    def depths(self, b: int) -> list[int]:
        """Per new token of request b, its depth below the root (the root: 0)."""
        out: list[int] = []
        for p in self.parents_cpu[b]:
            out.append(0 if p == NO_PARENT else out[p] + 1)
        return out

    def extend_masks(
        self, b: int, prefix: int, window: int | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Request b's dense [new, prefix + new] mask (every prefix key, then its block) and, for
        layers with a sliding window, that mask less the keys out of each query's window (by
        positions: a new token sits at prefix + its depth; None without a window)."""
        block = self.blocks_cpu[b]
        mask = torch.ones(block.shape[0], prefix + block.shape[0], dtype=torch.bool)
        mask[:, prefix:] = block
        mask = mask.to(device)
        if window is None:
            return mask, None
        depth = torch.tensor(self.depths(b), dtype=torch.int64, device=device)
        pos_k = torch.cat([torch.arange(prefix, device=device), prefix + depth])
        return mask, mask & (pos_k[None, :] > (prefix + depth)[:, None] - window)


def ancestor_block(parents: Sequence[int]) -> torch.Tensor:
    """bool [n, n]: row r is True at r and at each of its ancestors."""
    n = len(parents)
    block = torch.zeros(n, n, dtype=torch.bool)
    for r, p in enumerate(parents):
        if not (p == NO_PARENT if r == 0 else 0 <= p < r):
            raise ValueError(
                f"new token {r}: parent {p} (the first new token is the root, every other one "
                "hangs under an earlier one)"
            )
        if p != NO_PARENT:
            block[r] = block[p]
        block[r, r] = True
    return block
