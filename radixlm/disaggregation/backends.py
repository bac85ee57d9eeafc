"""Transfer backends: how a room's KV gets from the prefill pool's slots to the decode pool's.

One interface, both sides (SGLang's KVSender / KVReceiver pair, per backend):

    prefill side   write(dest, pool, src_slots, push)   move the KV, layer by layer; `push(frames)`
                                                         sends frames to the decode's data socket
    decode side    prepare_pool(pool) -> ShmPool | None  what the decode side advertises in TransferDest
                   on_chunk(chunk, frames, pool, dst)    a tcp frame's KV into the pool's slots

The AuxRecord always follows the KV over the same ZMQ connection (so it arrives last).

- tcp: per layer one message [KVLayerChunk, K bytes, V bytes] (ZMQ over TCP, any host).
- shm: the decode server's pool lives in a /dev/shm file; the prefill writes K/V straight into its
  slots (index_put on the mapped file), as an RDMA write would: nothing crosses a socket but the aux.
- fake: nothing moves (warm-up, SGLang's fake backend): the decode side decodes on whatever its
  slots hold.

- mooncake (mooncake_backend.py): Mooncake's transfer engine (TCP here, RDMA where present): the
  decode side registers its pool's memory and advertises where each layer lives (MooncakePool, in
  TransferDest); the prefill side writes each layer's slots there, one batch of writes per layer.
  NIXL would be one more such class.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import atexit
import math
import mmap
import os
import pickle
import time
import uuid
from collections.abc import Callable

import torch

from radixlm.disaggregation.config import TRANSFER_BACKEND_REGISTRY
from radixlm.disaggregation.protocol import (
    KVLayerChunk,
    KVLayout,
    MooncakePool,
    ShmPool,
    TransferDest,
)

# Debug/test hook: seconds to sleep after each layer is written (lets a test kill a peer
# mid-transfer).
LAYER_DELAY_ENV = "RADIXLM_PD_DEBUG_LAYER_DELAY_S"


def _layer_delay() -> float:
    return float(os.environ.get(LAYER_DELAY_ENV, "0") or 0)


class TransferBackend:
    name = "base"

    def prepare_pool(self, pool) -> ShmPool | MooncakePool | None:
        return None

    def write(
        self, dest: TransferDest, pool, src_slots: torch.Tensor, push: Callable[[list], None]
    ) -> int:
        """Move the KV; returns the bytes moved."""
        return 0

    def on_chunk(self, chunk: KVLayerChunk, frames: list, pool, dst_slots: torch.Tensor) -> int:
        raise RuntimeError(f"the {self.name} backend receives no KV frames")


class FakeBackend(TransferBackend):
    name = "fake"


class TcpBackend(TransferBackend):
    name = "tcp"

    def write(self, dest, pool, src_slots, push) -> int:
        moved, delay = 0, _layer_delay()
        for layer in range(pool.num_layers):
            k, v = pool.get_kv_buffer(layer)
            ks, vs = (t.index_select(0, src_slots).contiguous() for t in (k, v))
            chunk = KVLayerChunk(dest.room, layer, 0, int(src_slots.numel()))
            push([pickle.dumps(chunk), _bytes(ks), _bytes(vs)])
            moved += 2 * ks.numel() * ks.element_size()
            if delay:
                time.sleep(delay)
        return moved

    def on_chunk(self, chunk, frames, pool, dst_slots) -> int:
        k_buf, v_buf = pool.get_kv_buffer(chunk.layer)
        shape = (chunk.count, *k_buf.shape[1:])
        slots = dst_slots[chunk.start : chunk.start + chunk.count]
        for buf, frame in ((k_buf, frames[0]), (v_buf, frames[1])):
            buf[slots] = (
                torch.frombuffer(bytearray(frame), dtype=torch.uint8).view(buf.dtype).view(shape)
            )
        return 2 * len(frames[0])


class ShmBackend(TransferBackend):
    name = "shm"

    def __init__(self):
        self._maps: dict[str, tuple[mmap.mmap, list, list]] = {}  # prefill side: path -> its views

    def prepare_pool(self, pool) -> ShmPool:
        """Moves the decode pool's K/V buffers into a /dev/shm file (zeros: the pool holds nothing
        yet)."""
        if pool.device.type != "cpu":
            raise ValueError(
                "disaggregation_transfer_backend shm needs the KV pool in CPU memory: use tcp"
            )
        path = f"/dev/shm/radixlm-kv-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        slots = pool.size + 1
        layout = KVLayout.of(pool)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _file_bytes(layout, slots))
            mm = mmap.mmap(fd, _file_bytes(layout, slots))
        finally:
            os.close(fd)
        atexit.register(_unlink, path)
        ks, vs = _views(mm, layout, slots)
        pool.k_buffer, pool.v_buffer = ks, vs
        self._decode_map = mm  # the buffers' memory lives as long as this backend
        return ShmPool(path, slots)

    def write(self, dest, pool, src_slots, push) -> int:
        shm = dest.remote_pool
        if not isinstance(shm, ShmPool):
            raise RuntimeError(
                "the decode server advertised no shared-memory pool (is it running"
                " --disaggregation-transfer-backend shm on this host?)"
            )
        if shm.path not in self._maps:
            fd = os.open(shm.path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, _file_bytes(dest.layout, shm.slots))
            finally:
                os.close(fd)
            self._maps[shm.path] = (mm, *_views(mm, dest.layout, shm.slots))
        _, ks, vs = self._maps[shm.path]
        dst = torch.tensor(dest.dst_slots, dtype=torch.int64)
        moved, delay = 0, _layer_delay()
        for layer in range(pool.num_layers):
            k, v = pool.get_kv_buffer(layer)
            ks[layer][dst] = k.index_select(0, src_slots)
            vs[layer][dst] = v.index_select(0, src_slots)
            moved += 2 * int(src_slots.numel()) * k[0].numel() * k.element_size()
            if delay:
                time.sleep(delay)
        return moved


def make_backend(name: str) -> TransferBackend:
    return TRANSFER_BACKEND_REGISTRY.get(name)()


def _bytes(t: torch.Tensor):
    return t.view(torch.uint8).numpy()  # zero-copy frame of a contiguous tensor


def _file_bytes(layout: KVLayout, slots: int) -> int:
    elem = torch.empty((), dtype=layout.torch_dtype).element_size()
    return max(1, 2 * layout.num_layers * layout.num_kv_heads * slots * layout.head_dim * elem)


def _views(mm: mmap.mmap, layout: KVLayout, slots: int) -> tuple[list, list]:
    """Each layer's K and V as [slots, kv_heads, head_dim] views of the file (head-major
    storage)."""
    dtype = layout.torch_dtype
    per = layout.num_kv_heads * slots * layout.head_dim
    whole = torch.frombuffer(mm, dtype=torch.uint8).view(dtype)
    ks, vs = [], []
    for layer in range(layout.num_layers):
        for i, out in enumerate((ks, vs)):
            off = (2 * layer + i) * per
            out.append(
                whole[off : off + per]
                .view(layout.num_kv_heads, slots, layout.head_dim)
                .permute(1, 0, 2)
            )
    assert math.prod(whole.shape) >= 2 * layout.num_layers * per
    return ks, vs


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
