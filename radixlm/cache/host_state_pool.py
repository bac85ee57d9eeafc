"""HostStatePool: the host tier (L2) of a hybrid model's state snapshots, beside HostKVPool.

`size` slots, each one full snapshot: every state layer's tensors with MambaPool's shapes and
dtypes (exact copies), in plain host tensors as HostKVPool's. Slots are 0..size-1 here; in the
MambaPool's copy queue host slot h is `pool.host_index(h)`, so a backup (device -> host) and a
load (host -> device) run on the forward's thread, in order with the other state copies
(MambaPool.apply_copies): never racing a forward in flight, nor a copy queued before them.

Sizing (hi_mamba_radix_cache.py: create_hi_mamba_radix_cache): the host budget is split the way
the device's is (--mamba-full-memory-ratio or --max-mamba-cache-size): with --hicache-size B the
snapshots get B x state bytes / (state + KV bytes) of the device, the KV the rest; with
--hicache-ratio r the host holds r x the device's snapshot slots beside r x its KV tokens.

Integrity: a backup records a checksum of the slot's bytes when it has run (`write_from`, the
forward's thread); until then the slot is not readable. Before a load is queued the scheduler
recomputes it (`verify`): a mismatch is a damaged copy, dropped by the tree (a miss for its part
of the prefix, never a wrong state). A slot freed while its backup is still queued is held back
(`deferred`) until the backup has run, so no later backup of the same slot can be overtaken.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.cache.state_pool import MambaPool, StateSpec


class HostStatePool:
    def __init__(self, layer_specs: list[list[StateSpec]], size: int):
        self.size = size
        self.buffers: list[dict[str, torch.Tensor]] = [
            {s.name: torch.zeros((size, *s.shape), dtype=s.dtype) for s in specs}
            for specs in layer_specs
        ]
        self.clear()

    # --- slots (the scheduler's thread) -----------------------------------------------
    def clear(self) -> None:
        self.free_slots: list[int] = list(range(self.size))
        self.deferred: list[int] = []  # freed while their backup was still queued
        # per slot: the checksum its backup recorded; None until that backup has run
        self.checksums: list[int | None] = [None] * self.size

    def _reclaim(self) -> None:
        if self.deferred:
            done = [h for h in self.deferred if self.checksums[h] is not None]
            self.deferred = [h for h in self.deferred if self.checksums[h] is None]
            self.free_slots += done

    def available(self) -> int:
        self._reclaim()
        return len(self.free_slots)

    def alloc(self) -> int | None:
        """A free slot, to be written by a backup queued next (unreadable until it has run)."""
        self._reclaim()
        if not self.free_slots:
            return None
        h = self.free_slots.pop(0)
        self.checksums[h] = None
        return h

    def free(self, h: int) -> None:
        assert 0 <= h < self.size, h
        (self.free_slots if self.checksums[h] is not None else self.deferred).append(h)

    def verify(self, h: int) -> bool | None:
        """Whether slot h still holds what its backup wrote; None: the backup has not run yet."""
        want = self.checksums[h]
        return None if want is None else self.checksum(h) == want

    def checksum(self, h: int) -> int:
        """CRC-32 of slot h's bytes, every layer's tensors in order."""
        out = 0
        for layer in self.buffers:
            for buf in layer.values():
                out = zlib.crc32(buf[h].contiguous().view(torch.uint8).numpy(), out)
        return out

    # --- copies (the forward's thread, from MambaPool.apply_copies) -----------------------
    def transfer(self, pool: MambaPool, src: int, dst: int) -> None:
        """One queued copy: device slot src -> host pool.host_index(h), or back."""
        base = pool.num_slots
        if dst >= base:
            self.write_from(pool, src, dst - base)
        else:
            self.read_into(pool, src - base, dst)

    def write_from(self, pool: MambaPool, slot: int, h: int) -> None:
        for host, dev in zip(self.buffers, pool.buffers):
            for name, buf in host.items():
                buf[h].copy_(dev[name][slot])  # a blocking copy: done before the checksum
        self.checksums[h] = self.checksum(h)

    def read_into(self, pool: MambaPool, h: int, slot: int) -> None:
        for host, dev in zip(self.buffers, pool.buffers):
            for name, buf in host.items():
                dev[name][slot].copy_(buf[h])
