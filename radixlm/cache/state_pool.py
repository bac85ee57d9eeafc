"""MambaPool: the recurrent states of a hybrid model's state layers (SGLang's name).

A Gated DeltaNet, Mamba-2 or short-conv layer keeps, per request, a fixed-size state instead of a
KV entry per token: a conv window and (except short conv) a recurrent matrix. The pool holds every
state layer's tensors over one slot index space:

    0 .. rows - 1                  request rows: the running request in ReqToTokenPool row r keeps
                                   its state in slot r (allocated with the row, nothing to track)
    rows .. rows + snapshots - 1   snapshots: copies of a state after some prefix, owned by a node
                                   of the prefix cache (cache/mamba_radix_cache.py) or, between the
                                   step that wrote one and the processing of its result, by the
                                   request that asked for it
    .. + drafts - 1                draft slots (speculative decoding only): a verify step keeps the
                                   state after each draft-tree node in one of them, so that the
                                   accepted path's last state becomes the request's
                                   (model/layers/linear_attn/draft_states.py); owned by the request
                                   from the step's launch to the processing of its result

    rows + snapshots + h           host snapshot h (the hierarchical cache's HostStatePool,
                                   cache/host_state_pool.py, when one is attached as `host`)

Copies between slots run on the forward's thread, in order, at the start of a forward
(`apply_copies`) or where a forward takes a snapshot (`copy_layer`): the scheduler only says which,
queueing them here (`queue_copy`) for the next forward (`take_copies`). One queue for the state
tracker and the tree alike: a slot freed and reused is read and written in the order they decided,
host backups and loads included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

ZERO = -1  # a copy from ZERO clears the destination: a request that starts from no prefix


@dataclass(frozen=True)
class StateSpec:
    """One tensor of a state layer's per-request state."""

    name: str  # "conv", "ssm"
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = torch.tensor([], dtype=self.dtype).element_size()
        for d in self.shape:
            n *= d
        return n


class HostTier(Protocol):
    """Where host snapshots live (host_state_pool.py: HostStatePool)."""

    def transfer(self, pool: MambaPool, src: int, dst: int) -> None:
        """One queued copy between a device slot and a host one (either way)."""


class MambaPool:
    def __init__(
        self,
        layer_specs: list[list[StateSpec]],
        rows: int,
        snapshots: int,
        device: str | torch.device = "cpu",
        drafts: int = 0,
    ):
        """layer_specs: per state layer (in the model's order), its state tensors."""
        self.layer_specs = layer_specs
        self.rows, self.snapshots, self.drafts = rows, snapshots, drafts
        self.device = torch.device(device)
        slots = rows + snapshots + drafts
        self.buffers: list[dict[str, torch.Tensor]] = [
            {
                s.name: torch.zeros((slots, *s.shape), dtype=s.dtype, device=self.device)
                for s in specs
            }
            for specs in layer_specs
        ]
        self.host: HostTier | None = None  # the hierarchical cache's host snapshots
        self.clear()

    @staticmethod
    def bytes_per_state(layer_specs: list[list[StateSpec]]) -> int:
        return sum(s.nbytes for specs in layer_specs for s in specs)

    @property
    def state_bytes(self) -> int:
        return self.bytes_per_state(self.layer_specs)

    @property
    def num_slots(self) -> int:
        return self.rows + self.snapshots + self.drafts

    @property
    def total_bytes(self) -> int:
        return self.state_bytes * self.num_slots

    def host_index(self, host_slot: int) -> int:
        """Host snapshot host_slot in the copies' index space (past the pool's own slots)."""
        return self.num_slots + host_slot

    def layer(self, state_layer_id: int) -> dict[str, torch.Tensor]:
        return self.buffers[state_layer_id]

    # --- snapshot slots ----------------------------------------------------------
    def clear(self) -> None:
        """Every snapshot slot free, no copy queued (the scheduler is idle)."""
        first_draft = self.rows + self.snapshots
        self.free_snapshots: list[int] = list(range(self.rows, first_draft))
        self.free_drafts: list[int] = list(range(first_draft, self.num_slots))
        self.pending: list[tuple[int, int]] = []

    def available_snapshots(self) -> int:
        return len(self.free_snapshots)

    def alloc_snapshot(self) -> int | None:
        return self.free_snapshots.pop(0) if self.free_snapshots else None

    def free_snapshot(self, slot: int) -> None:
        assert self.rows <= slot < self.rows + self.snapshots, slot
        self.free_snapshots.append(slot)

    # --- draft slots ---------------------------------------------------------------
    def alloc_drafts(self, n: int) -> list[int]:
        """n draft slots (the scheduler bounds a step's draft nodes by self.drafts)."""
        assert n <= len(self.free_drafts), (n, len(self.free_drafts))
        taken, self.free_drafts = self.free_drafts[:n], self.free_drafts[n:]
        return taken

    def release_drafts(self, slots: list[int]) -> None:
        first = self.rows + self.snapshots
        assert all(first <= s < self.num_slots for s in slots), slots
        self.free_drafts += slots

    # --- the copy queue (the scheduler's thread) ---------------------------------
    def queue_copy(self, src: int, dst: int) -> None:
        self.pending.append((src, dst))

    def take_copies(self) -> list[tuple[int, int]]:
        """The copies queued since the last call, for the next forward."""
        copies, self.pending = self.pending, []
        return copies

    # --- copies (the forward's thread) ------------------------------------------
    def apply_copies(self, copies: list[tuple[int, int]]) -> None:
        """(src, dst) in order; src ZERO clears dst. Consecutive copies are batched where no later
        one reads what an earlier one writes; a copy to or from the host runs alone, in order."""
        batch: list[tuple[int, int]] = []
        written: set[int] = set()
        for src, dst in copies:
            if max(src, dst) >= self.num_slots:
                self._copy(batch)
                batch, written = [], set()
                assert self.host is not None, "a host snapshot without a host tier"
                self.host.transfer(self, src, dst)
                continue
            if src in written or dst in written:
                self._copy(batch)
                batch, written = [], set()
            batch.append((src, dst))
            written.add(dst)
        self._copy(batch)

    def _copy(self, batch: list[tuple[int, int]]) -> None:
        if not batch:
            return
        zero = [d for s, d in batch if s == ZERO]
        pairs = [(s, d) for s, d in batch if s != ZERO]
        as_index = lambda xs: torch.tensor(xs, dtype=torch.int64, device=self.device)
        # Reads before the clears: a batch's clear may hit a slot an earlier copy of it reads (a
        # released row's snapshot, then a new request starting from zeros in that row).
        for layer in self.buffers:
            for buf in layer.values():
                if pairs:
                    buf[as_index([d for _, d in pairs])] = buf[as_index([s for s, _ in pairs])]
                if zero:
                    buf[as_index(zero)] = 0

    def copy_layer(self, state_layer_id: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """One layer's states at slots src into slots dst (a snapshot taken inside a forward)."""
        for buf in self.buffers[state_layer_id].values():
            buf[dst] = buf[src]
