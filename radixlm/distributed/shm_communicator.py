"""ShmCommunicator: all-reduce and all-gather through shared memory for ranks on one host (what
SGLang's CPU backend does with shm_allreduce), the other operations over gloo.

Layout of the segment (a file in /dev/shm, unlinked as soon as every rank mapped it, so nothing is
left behind even after a SIGKILL): one int64 sequence number per rank (each on its own cache line),
then two buffers (alternate calls use alternate buffers) of one slot per rank.

A call: write my data into my slot of buffer seq % 2, publish seq, spin until every rank published
seq, then read every slot in rank order (every rank sums in the same order: the same bits on all).
Two buffers are enough: a rank writes buffer b again only at call seq + 2, and it got past call
seq + 1 only after every rank published seq + 1, which each does after it finished reading call
seq. Stores become visible in program order on x86 (TSO), so the data is there before the number.
Tensors larger than a slot go in slot-sized pieces (all-reduce) or over gloo (all-gather).
"""

from __future__ import annotations

import mmap
import os
import time
import uuid
from typing import Any

import numpy as np
import torch

from radixlm.distributed.communicator import Communicator, TorchDistCommunicator

SLOT_BYTES = 4 * 2**20  # per rank and buffer: a 1k-token chunk of a 4096-wide fp32 hidden state
_LINE = 64  # one sequence number per cache line (no false sharing between spinning ranks)
SPINS_BEFORE_YIELD = 200  # then sched_yield: an oversubscribed host must let the other rank run


class ShmTimeout(RuntimeError):
    pass


class ShmCommunicator(Communicator):
    def __init__(
        self,
        fallback: TorchDistCommunicator,
        timeout: float = 600.0,
        slot_bytes: int = SLOT_BYTES,
        shm_dir: str = "/dev/shm",
    ):
        self.fallback = fallback
        self.rank, self.world_size = fallback.rank, fallback.world_size
        self.timeout = timeout
        self.slot_bytes = slot_bytes
        header = _LINE * self.world_size
        size = header + 2 * self.world_size * slot_bytes
        path = None
        if self.rank == 0:
            path = os.path.join(
                shm_dir if os.path.isdir(shm_dir) else "/tmp", f"radixlm-shm-{uuid.uuid4().hex}"
            )
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        path = fallback.broadcast_pyobj(path)
        if self.rank != 0:
            fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        fallback.barrier()  # every rank mapped it: the name can go
        if self.rank == 0:
            os.unlink(path)
        raw = np.frombuffer(self._map, dtype=np.uint8)
        self._seqs = raw[:header].view(np.int64)[:: _LINE // 8]
        data = torch.from_numpy(raw[header:])
        self._slots = [
            [
                data[
                    (b * self.world_size + r) * slot_bytes : (b * self.world_size + r + 1)
                    * slot_bytes
                ]
                for r in range(self.world_size)
            ]
            for b in range(2)
        ]
        self._seq = 0

    # --- the exchange ------------------------------------------------------------------
    def _publish_and_wait(self, payload: torch.Tensor) -> list[torch.Tensor]:
        """payload: uint8, at most a slot. -> every rank's slot of this call (uint8 views)."""
        self._seq += 1
        slots = self._slots[self._seq % 2]
        slots[self.rank][: payload.numel()].copy_(payload)
        self._seqs[self.rank] = self._seq
        self._wait(self._seq)
        return slots

    def _wait(self, seq: int) -> None:
        seqs, spins, deadline = self._seqs, 0, None
        while seqs.min() < seq:
            spins += 1
            if spins > SPINS_BEFORE_YIELD:
                os.sched_yield()
                if spins % 4096 == 0:
                    now = time.monotonic()
                    deadline = deadline or now + self.timeout
                    if now > deadline:
                        raise ShmTimeout(
                            f"shared-memory collective: ranks {np.nonzero(seqs < seq)[0].tolist()}"
                            f" did not arrive within {self.timeout:g} s"
                        )

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu" or not t.is_contiguous():
            return self.fallback.all_reduce(t)
        flat = t.view(-1)
        per = max(1, self.slot_bytes // t.element_size())
        for start in range(0, flat.numel(), per):
            piece = flat[start : start + per]
            slots = self._publish_and_wait(piece.view(torch.uint8))
            n = piece.numel()
            views = [s.view(t.dtype)[:n] for s in slots]
            piece.copy_(views[0])
            for v in views[1:]:
                piece.add_(v)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        t = t.contiguous()
        if t.device.type != "cpu" or t.numel() * t.element_size() > self.slot_bytes:
            return self.fallback.all_gather(t, dim)
        slots = self._publish_and_wait(t.view(-1).view(torch.uint8))
        parts = [s.view(t.dtype)[: t.numel()].view(t.shape) for s in slots]
        return torch.cat(parts, dim=dim)

    # --- the rest over gloo ---------------------------------------------------------------
    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        return self.fallback.broadcast(t, src)

    def broadcast_pyobj(self, obj: Any, src: int = 0) -> Any:
        return self.fallback.broadcast_pyobj(obj, src)

    def send(self, t: torch.Tensor, dst: int) -> None:
        self.fallback.send(t, dst)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        return self.fallback.recv(t, src)

    def barrier(self) -> None:
        self.fallback.barrier()

    def close(self) -> None:
        self._slots, self._seqs = [], None
        try:
            self._map.close()
        except (
            BufferError
        ):  # a view still exported (an exception's traceback): the OS unmaps at exit
            pass
