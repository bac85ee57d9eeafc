"""`--disaggregation-transfer-backend mooncake` (SGLang's default PD backend): a room's KV moves
with Mooncake's transfer engine, TCP here and RDMA where the machine has it, as one-sided writes
into the decode server's pool; nothing but the aux record crosses the ZMQ socket.

The decode rank registers every layer's K and V memory with its engine and advertises them in
TransferDest (MooncakePool: the engine's session, each layer's base addresses, a slot's and a KV
head's byte strides: the CPU pool keeps each head's slots together, a CUDA pool each slot's heads).
The prefill rank gathers a layer's source slots head-major into a registered staging buffer and
writes, for every KV head, each run of consecutive destination slots in one write: one batch of
writes per layer, synchronous, so the aux record that follows finds the KV in place.

The engine reads SGLang's variables: MOONCAKE_LOCAL_HOSTNAME (the address peers reach this host
by, default 127.0.0.1), MOONCAKE_TE_META_DATA_SERVER (default P2PHANDSHAKE: the engines exchange
segment descriptors directly), MOONCAKE_PROTOCOL (tcp, rdma), MOONCAKE_DEVICE (RDMA devices).
"""

from __future__ import annotations

import time

import torch

from radixlm.cache.storage_mooncake import mooncake_env
from radixlm.disaggregation.backends import TransferBackend, _layer_delay
from radixlm.disaggregation.protocol import MooncakePool


def _engine():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise ValueError(
            "disaggregation_transfer_backend mooncake needs Mooncake's Python package"
            f" (pip install mooncake-transfer-engine-non-cuda, or its CUDA build): {e}"
        ) from None
    env = mooncake_env(store=False)
    engine = TransferEngine()
    host = env["MOONCAKE_LOCAL_HOSTNAME"]
    rc = engine.initialize(
        host,
        env["MOONCAKE_TE_META_DATA_SERVER"],
        env["MOONCAKE_PROTOCOL"],
        env["MOONCAKE_DEVICE"],
    )
    if rc != 0:
        raise ValueError(
            f"disaggregation_transfer_backend mooncake: the engine failed to start ({rc})"
        )
    return engine, host


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """(offset in slots, first slot, length) of each run of consecutive slots."""
    runs, start = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            runs.append((start, slots[start], i - start))
            start = i
    return runs


class MooncakeBackend(TransferBackend):
    name = "mooncake"

    def __init__(self):
        self.engine, self.host = _engine()
        self._staging: torch.Tensor | None = None  # the prefill side's registered source buffer

    # --- decode side ------------------------------------------------------------------------
    def prepare_pool(self, pool) -> MooncakePool:
        k0, _ = pool.get_kv_buffer(0)
        if k0.stride(2) != 1:
            raise ValueError(
                "disaggregation_transfer_backend mooncake: a KV row must be contiguous"
            )
        registered = set()
        for layer in range(pool.num_layers):
            for buf in pool.get_kv_buffer(layer):
                addr, size = _storage(buf)
                if addr not in registered:
                    registered.add(addr)
                    if self.engine.register_memory(addr, size) != 0:
                        raise ValueError("mooncake: cannot register the KV pool's memory")
        elem = k0.element_size()
        ks, vs = zip(*(pool.get_kv_buffer(layer) for layer in range(pool.num_layers)))
        return MooncakePool(
            f"{self.host}:{self.engine.get_rpc_port()}",
            [t.data_ptr() for t in ks],
            [t.data_ptr() for t in vs],
            k0.stride(0) * elem,
            k0.stride(1) * elem,
        )

    # --- prefill side -----------------------------------------------------------------------
    def _stage(self, nbytes: int) -> torch.Tensor:
        if self._staging is None or self._staging.numel() < nbytes:
            if self._staging is not None:
                self.engine.unregister_memory(self._staging.data_ptr())
            self._staging = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8)
            if self.engine.register_memory(self._staging.data_ptr(), self._staging.numel()) != 0:
                raise RuntimeError("mooncake: cannot register the staging buffer")
        return self._staging

    def write(self, dest, pool, src_slots, push) -> int:
        remote = dest.remote_pool
        if not isinstance(remote, MooncakePool):
            raise RuntimeError(
                "the decode server advertised no Mooncake pool (is it running"
                " --disaggregation-transfer-backend mooncake?)"
            )
        n = int(src_slots.numel())
        k0, _ = pool.get_kv_buffer(0)
        heads, dim, elem = k0.shape[1], k0.shape[2], k0.element_size()
        row = dim * elem  # one head's values for one slot
        runs = _runs(list(dest.dst_slots[:n]))
        staging = self._stage(2 * heads * n * row)
        base = staging.data_ptr()
        moved, delay = 0, _layer_delay()
        for layer in range(pool.num_layers):
            srcs, dsts, lens = [], [], []
            for i, (buf, remote_base) in enumerate(
                zip(pool.get_kv_buffer(layer), (remote.k_addrs[layer], remote.v_addrs[layer]))
            ):
                # [heads, n, dim] at this tensor's half of the staging buffer
                part = staging[i * heads * n * row : (i + 1) * heads * n * row]
                part.view(buf.dtype).view(heads, n, dim).copy_(
                    buf.index_select(0, src_slots).permute(1, 0, 2)
                )
                for h in range(heads):
                    for off, first, length in runs:
                        srcs.append(base + ((i * heads + h) * n + off) * row)
                        dsts.append(
                            remote_base + first * remote.slot_stride + h * remote.head_stride
                        )
                        lens.append(length * row)
            rc = self.engine.batch_transfer_sync_write(remote.session, srcs, dsts, lens)
            if rc != 0:
                raise RuntimeError(
                    f"mooncake: writing layer {layer} to {remote.session} failed ({rc})"
                )
            moved += sum(lens)
            if delay:
                time.sleep(delay)
        return moved
