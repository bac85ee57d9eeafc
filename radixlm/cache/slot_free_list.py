"""SlotFreeList: the free KV slots of a token pool, allocated from the front, freed to the back.

A free used to be `torch.cat((free, freed))`: a copy of the whole list, O(pool size) per finished
request (16 MB for a 2M-token pool) where the freed run is a few tokens. Freed runs now wait in a
list and join the front only when an allocation needs more than the front holds, or when the whole
list is read; the order of the slots, and so every allocation, is what the eager concatenation gave.
"""

from __future__ import annotations

import torch


class SlotFreeList:
    def __init__(self, slots: torch.Tensor):
        self.reset(slots)

    def reset(self, slots: torch.Tensor) -> None:
        self._front = slots
        self._freed: list[torch.Tensor] = []
        self._freed_count = 0

    @property
    def slots(self) -> torch.Tensor:
        """Every free slot in allocation order."""
        self._join()
        return self._front

    def _join(self) -> None:
        if self._freed:
            self._front = torch.cat([self._front, *self._freed])
            self._freed, self._freed_count = [], 0

    def __len__(self) -> int:
        return int(self._front.numel()) + self._freed_count

    def alloc(self, need: int) -> torch.Tensor | None:
        if need > self._front.numel():
            if need > len(self):
                return None
            self._join()
        out, self._front = self._front[:need], self._front[need:]
        return out

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel():
            # A copy: callers free views of rows (req_to_token) that are reused and overwritten.
            self._freed.append(indices.to(self._front.device, copy=True))
            self._freed_count += int(indices.numel())
