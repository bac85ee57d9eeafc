"""HostKVPool: the L2 tier of the hierarchical cache, a host-memory KV pool larger than L1.

Token-granular like TokenToKVPool (slot 0 unused), per-layer [slots, kv_heads, head_dim] buffers.
Its element type may be more compact than L1's: a float32 L1 is kept as float16 by default (half
the bytes; a restored prefix then differs from a recomputed one by float16 rounding, ~1e-3
relative). An int8 or int4 L1 is kept as it is with its scales (exact).
"""

from __future__ import annotations

import torch

from radixlm.cache.kv_data import KVData, copy_slots, gather, scatter
from radixlm.cache.memory_pool import TokenToKVPool, kv_dtype_name, scaled_kv, stored_dim
from radixlm.cache.slot_free_list import SlotFreeList


def host_dtype_for(device_dtype: torch.dtype, option: str) -> torch.dtype:
    """The L2/L3 element type for an L1 of `device_dtype` (`--hicache-dtype`)."""
    if scaled_kv(device_dtype):
        name = kv_dtype_name(device_dtype)
        if option not in ("auto", name):
            raise ValueError(f"hicache_dtype: an {name} KV cache is kept as {name} (use auto)")
        return device_dtype
    if option == "auto":
        return torch.float16 if device_dtype == torch.float32 else device_dtype
    return getattr(torch, option)


class HostKVPool:
    def __init__(self, size: int, device_pool: TokenToKVPool, dtype: torch.dtype):
        self.size = size
        self.dtype = dtype
        self.num_layers = device_pool.num_layers
        held = device_pool.layers  # a pipeline stage's: the others' buffers are empty, as in L1
        # per layer (kv heads, head dim) as L1 keeps them (Gemma 4's differ per layer)
        dims = [device_pool.layer_shape(i) if i in held else (0, 0) for i in range(self.num_layers)]
        shapes = [(size + 1, heads, stored_dim(dim, dtype)) for heads, dim in dims]
        mla = device_pool.v_head_dim == 0  # an MLA latent pool: no V
        self.k_buffer = [torch.zeros(shape, dtype=dtype) for shape in shapes]
        self.v_buffer = [
            torch.zeros(shape if not mla else (*shape[:2], 0), dtype=dtype) for shape in shapes
        ]
        self.k_scale_buffer = self.v_scale_buffer = None
        if scaled_kv(dtype):
            self.k_scale_buffer = [torch.zeros(shape[:2]) for shape in shapes]
            self.v_scale_buffer = [torch.zeros(shape[:2]) for shape in shapes]
        self.bytes_per_token = sum(
            TokenToKVPool.bytes_per_token(1, heads, dim, dtype, 0 if mla else None)
            for heads, dim in dims
        )
        self.clear()

    def clear(self) -> None:
        self._free_list = SlotFreeList(torch.arange(1, self.size + 1, dtype=torch.int64))

    @property
    def free_slots(self) -> torch.Tensor:
        return self._free_list.slots

    def available_size(self) -> int:
        return len(self._free_list)

    def alloc(self, need: int) -> torch.Tensor | None:
        return self._free_list.alloc(need)

    def free(self, indices: torch.Tensor) -> None:
        self._free_list.free(indices)

    # --- data ---------------------------------------------------------------------
    def _bufs(self) -> tuple:
        return self.k_buffer, self.v_buffer, self.k_scale_buffer, self.v_scale_buffer

    def get(self, idx: torch.Tensor) -> KVData:
        return gather(*self._bufs(), idx, self.dtype)

    def set(self, idx: torch.Tensor, data: KVData) -> None:
        scatter(*self._bufs(), idx, data)

    def backup_from(
        self, pool: TokenToKVPool, dev_idx: torch.Tensor, host_idx: torch.Tensor
    ) -> None:
        """L1 -> L2, slot to slot."""
        for dst, src in zip(self._bufs(), _pool_bufs(pool)):
            if dst is not None:
                copy_slots(dst, host_idx, src, dev_idx)

    def load_into(self, pool: TokenToKVPool, host_idx: torch.Tensor, dev_idx: torch.Tensor) -> None:
        """L2 -> L1, slot to slot."""
        for dst, src in zip(_pool_bufs(pool), self._bufs()):
            if dst is not None:
                copy_slots(dst, dev_idx, src, host_idx)

    @staticmethod
    def read_device(pool: TokenToKVPool, idx: torch.Tensor, dtype: torch.dtype) -> KVData:
        """A copy of the KV at device slots idx, as `dtype` (kept by the L3 writer)."""
        return gather(*_pool_bufs(pool), idx, dtype)


def _pool_bufs(pool: TokenToKVPool) -> tuple:
    return pool.k_buffer, pool.v_buffer, pool.k_scale_buffer, pool.v_scale_buffer
