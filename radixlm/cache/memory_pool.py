"""KV memory: request slots (ReqToTokenPool) and token-granular KV slots (TokenToKVPool).

Slot 0 of the KV pool is a dummy that is never handed out, so padded writes have
somewhere harmless to go.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence

import torch

from radixlm.cache.slot_free_list import SlotFreeList

logger = logging.getLogger(__name__)

# The int4 KV cache's storage: two 4-bit values a byte (uint8), Hadamard-turned per head and scaled
# per token and head by the native kv_store (kernels/csrc/kv_pool.h).
INT4_KV = torch.uint8


def scaled_kv(dtype: torch.dtype) -> bool:
    """int8 and int4 pools keep a float32 scale per token and head beside the values."""
    return dtype in (torch.int8, INT4_KV)


def kv_dtype_name(dtype: torch.dtype) -> str:
    """--kv-cache-dtype's name of a pool element type."""
    return "int4" if dtype == INT4_KV else str(dtype).replace("torch.", "")


def stored_dim(head_dim: int, dtype: torch.dtype) -> int:
    """Elements a head's row of `head_dim` values takes in a pool of `dtype` (int4: bytes)."""
    return head_dim // 2 if dtype == INT4_KV else head_dim


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """CPU zeros in fresh anonymous pages, which the OS commits when they are first written: a pool
    sized from the RAM available (--mem-fraction-static) takes memory as it fills, not all at
    start-up (torch.zeros writes every byte). Huge pages as torch's own large buffers get
    (radixlm/__init__.py).
    """
    import math
    import mmap
    import os

    nbytes = max(1, math.prod(shape) * torch.empty((), dtype=dtype).element_size())
    buf = mmap.mmap(-1, nbytes)
    huge = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1" and huge is not None:
        buf.madvise(huge)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype)[: math.prod(shape)].view(shape)


class ReqToTokenPool:
    """Maps a request slot to the KV slot of each of its token positions."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu"):
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64, device=device)
        self.free_slots: list[int] = list(range(size))
        # Bumped at each alloc, so (slot, generation) names one request's tenure of a slot.
        self.generation: list[int] = [0] * size

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        if not self.free_slots:
            return None
        idx = self.free_slots.pop()
        self.generation[idx] += 1
        return idx

    def free(self, idx: int) -> None:
        assert 0 <= idx < self.size and idx not in self.free_slots, f"double free of req slot {idx}"
        self.free_slots.append(idx)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))


class TokenToKVPool:
    """Per-layer K and V buffers of shape [size + 1, kv_heads, head_dim] plus a free list.

    dtype is the element type stored: the model's, a 16-bit float, or int8 / int4 (INT4_KV: rows of
    head_dim / 2 bytes) with a float32 scale per token and head (k_scale_buffer / v_scale_buffer
    [size + 1, kv_heads]). Writes convert; on CPU the native kv_store op does it in one pass (int8
    and int4 need it)."""

    # The windowed layers' window, in tokens: 0 here, every layer keeps every token; a pool with
    # windowed-layer slots of their own (SWATokenToKVPool) sets it, and the prefix cache and the
    # scheduler's WindowTracker follow it.
    window: int = 0
    # Bumped whenever slots are freed: copies of KV read earlier are stale only after that.
    free_epoch: int = 0

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        layers: Collection[int] | None = None,
        layer_shapes: Sequence[tuple[int, int]] | None = None,
    ):
        """layers: the layer ids this pool holds KV for (a pipeline stage's, or the full or windowed
        layers of SWATokenToKVPool; None: all). The others
        get empty placeholders (no KV heads), so layer ids stay global.
        layer_shapes: per layer id (kv_heads, head_dim) where layers differ (Gemma 4's 512-dim
        global and 256-dim sliding heads; 0 heads: a layer that reads another's KV); None:
        num_kv_heads x head_dim everywhere (the widest of layer_shapes otherwise)."""
        self.size = size
        self.num_layers = num_layers
        self.layers = range(num_layers) if layers is None else layers
        self.layer_shapes = None if layer_shapes is None else tuple(layer_shapes)
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim  # V's width per head (0 in an MLA latent pool: mla_pool.py)
        self.dtype = dtype
        self.device = torch.device(device)
        if dtype == INT4_KV:  # the Hadamard turn runs over a power-of-two row
            dims = sorted({self.layer_shape(i)[1] for i in self.layers})
            if any(d & (d - 1) or d > 512 for d in dims):
                raise ValueError(
                    f"kv_cache_dtype int4 needs a power-of-two head_dim of at most 512 (its"
                    f" Hadamard turn); this model's attention has head_dim {dims}"
                )
        self._alloc_buffers()
        self._native = None  # the native kv_store op, looked up at the first write
        self.clear()

    def _alloc_buffers(self) -> None:
        """K/V (and int8 scale) buffers of this pool's layers; the others get empty placeholders (no
        KV heads), so layer ids stay global."""

        def shape_of(i: int) -> tuple[int, int, int]:
            heads, dim = self.layer_shape(i)
            return (self.size + 1, heads if i in self.layers else 0, stored_dim(dim, self.dtype))

        self.k_buffer = [self._buffer(shape_of(i)) for i in range(self.num_layers)]
        self.v_buffer = [self._buffer(shape_of(i)) for i in range(self.num_layers)]
        self.k_scale_buffer: list[torch.Tensor] | None = None
        self.v_scale_buffer: list[torch.Tensor] | None = None
        if scaled_kv(self.dtype):
            scales = lambda: [
                torch.zeros(shape_of(i)[:2], device=self.device) for i in range(self.num_layers)
            ]
            self.k_scale_buffer, self.v_scale_buffer = scales(), scales()

    def _buffer(self, shape: tuple[int, int, int]) -> torch.Tensor:
        """[slots, kv_heads, head_dim]. On CPU stored head-major (a view of [kv_heads, slots,
        head_dim]): a KV head's rows of consecutive slots are then one stream in memory, which the
        CPU's prefetchers follow (decode attention reads K/V at ~1.4x the rate of slot-major rows).
        """
        if self.device.type != "cpu" or 0 in shape:  # (no heads: another pipeline stage's layer)
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        return untouched_zeros((shape[1], shape[0], shape[2]), self.dtype).permute(1, 0, 2)

    def layer_shape(self, layer_id: int) -> tuple[int, int]:
        """(kv_heads, head_dim) of layer layer_id's K and V."""
        if self.layer_shapes is None:
            return self.num_kv_heads, self.head_dim
        return self.layer_shapes[layer_id]

    @staticmethod
    def bytes_per_token(
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        v_head_dim: int | None = None,
    ) -> int:
        elem = torch.tensor([], dtype=dtype).element_size()
        scales = 4 if scaled_kv(dtype) else 0  # one float32 per token and head
        v_dim = head_dim if v_head_dim is None else v_head_dim
        row = (stored_dim(head_dim, dtype) + stored_dim(v_dim, dtype)) * elem
        return num_layers * num_kv_heads * (row + 2 * scales)

    @staticmethod
    def shaped_bytes_per_token(layer_shapes: Iterable[tuple[int, int]], dtype: torch.dtype) -> int:
        """bytes_per_token of layers each of its own (kv_heads, head_dim)."""
        return sum(TokenToKVPool.bytes_per_token(1, h, d, dtype) for h, d in layer_shapes)

    @property
    def total_bytes(self) -> int:
        per = self.shaped_bytes_per_token((self.layer_shape(i) for i in self.layers), self.dtype)
        return per * (self.size + 1)

    # --- allocator -------------------------------------------------------
    def clear(self) -> None:
        self._free_list = SlotFreeList(
            torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        )
        self.free_epoch += 1

    @property
    def free_slots(self) -> torch.Tensor:
        return self._free_list.slots

    @free_slots.setter
    def free_slots(self, slots: torch.Tensor) -> None:
        self._free_list.reset(slots)

    def available_size(self) -> int:
        return len(self._free_list)

    def alloc(self, need: int) -> torch.Tensor | None:
        return self._free_list.alloc(need)

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self._free_list.free(indices)
        self.free_epoch += 1

    def check(self) -> str | None:
        """What is wrong with the pool's own bookkeeping beyond slot ownership (a second slot
        space: swa_pool.py), or None."""
        return None

    # --- data ----------------------------------------------------------------
    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """k, v: [tokens, kv_heads, head_dim] in the model dtype, stored at slots loc."""
        if self._native is None:  # the store of this pool's device, chosen at the first write
            from radixlm.kernels.ops import fused_ops

            # The native op on CPU float32, the Triton kernel on CUDA (float KV only), else torch's
            # indexing.
            cuda_int = k.device.type == "cuda" and scaled_kv(self.dtype)
            dims = {self.layer_shape(i)[1] for i in self.layers}
            self._native = (
                fused_ops(k) if all(d % 8 == 0 for d in dims) and not cuda_int else None
            ) or False
            if scaled_kv(self.dtype) and not self._native:
                raise RuntimeError(
                    "an int8 / int4 KV cache needs the native CPU kernels (float32 on CPU)"
                )
        if self._native:
            scales = self.get_kv_scales(layer_id)
            self._native.kv_store_(
                k, v, loc, self.k_buffer[layer_id], self.v_buffer[layer_id], *scales
            )
        else:
            self.k_buffer[layer_id][loc] = k.to(self.dtype)
            self.v_buffer[layer_id][loc] = v.to(self.dtype)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def get_kv_scales(self, layer_id: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """int8 / int4 pools: the per-token, per-head scales of K and V; else (None, None)."""
        if self.k_scale_buffer is None:
            return None, None
        return self.k_scale_buffer[layer_id], self.v_scale_buffer[layer_id]

    # --- memory given back (release_memory_occupation) ---------------------------------
    def release_memory(self) -> None:
        """Free every K/V buffer (nothing may hold a slot: the cache was flushed); the pool keeps
        its size and free list, and resume_memory allocates the buffers again."""
        empty = torch.empty(
            (0, self.num_kv_heads, self.head_dim), dtype=self.dtype, device=self.device
        )
        self.k_buffer = [empty] * self.num_layers
        self.v_buffer = [empty] * self.num_layers
        if self.k_scale_buffer is not None:
            self.k_scale_buffer = self.v_scale_buffer = [empty[:, :, 0]] * self.num_layers

    def resume_memory(self) -> None:
        self._alloc_buffers()
