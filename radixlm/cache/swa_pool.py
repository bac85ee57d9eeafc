"""SWATokenToKVPool: the KV pool of a model with sliding-window layers, in two slot spaces (SGLang's
SWAKVPool).

A windowed layer's query reads only the last `window` keys, so most of a long context's KV of those
layers is never read again. The pool keeps the full-attention layers' KV in the slot space every
request row and tree node names (`full`, sized --max-total-tokens) and the windowed layers' KV in a
second, smaller one (`swa`, --swa-full-tokens-ratio of it). Each full slot maps to the swa slot
holding its windowed layers' KV (`full_to_swa`; 0, the dummy: none). `alloc` takes one of each;
`free` gives both back; `free_swa` gives back the windowed part alone (a running request's tokens
that left its window, a tree node's window evicted under pressure), which leaves the token's full
layers in place. Attention of a windowed layer reads `translate(slots)` in `swa`.

A swa slot is owned by the full slot mapping to it (so by that slot's owner: a tree node or a
request), or is on `swa`'s free list.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from radixlm.cache.memory_pool import TokenToKVPool


class SWATokenToKVPool:
    """The pool interface of TokenToKVPool (alloc / free / available_size / clear and the
    per-layer buffers), over two TokenToKVPools."""

    def __init__(
        self,
        size: int,
        swa_size: int,
        num_layers: int,
        swa_layers: Collection[int],
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        window: int = 0,
        layer_shapes: Sequence[tuple[int, int]] | None = None,
    ):
        """layer_shapes: per layer id (kv_heads, head_dim) where they differ (TokenToKVPool)."""
        self.swa_layer_ids = frozenset(swa_layers)
        full_layers = [i for i in range(num_layers) if i not in self.swa_layer_ids]
        self.full = TokenToKVPool(
            size,
            num_layers,
            num_kv_heads,
            head_dim,
            dtype,
            device,
            layers=full_layers,
            layer_shapes=layer_shapes,
        )
        self.swa = TokenToKVPool(
            swa_size,
            num_layers,
            num_kv_heads,
            head_dim,
            dtype,
            device,
            layers=self.swa_layer_ids,
            layer_shapes=layer_shapes,
        )
        self.layer_shapes = self.full.layer_shapes
        self.size, self.swa_size, self.window = size, swa_size, window
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.v_head_dim, self.dtype, self.device = head_dim, dtype, self.full.device
        self.layers = range(num_layers)
        self.full_to_swa = torch.zeros(size + 1, dtype=torch.int64, device=self.full.device)
        # Per full slot: running requests whose window reads its windowed layers' KV from the tree
        # (scheduler/kv/window_tracker.py); a pinned slot's windowed KV is not evicted.
        self.swa_pins = torch.zeros(size + 1, dtype=torch.int32)

    # --- sizes ---------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        return self.full.total_bytes + self.swa.total_bytes

    bytes_per_token = staticmethod(TokenToKVPool.bytes_per_token)  # a token in every layer

    @staticmethod
    def split_bytes_per_token(
        num_full_layers: int,
        num_swa_layers: int,
        swa_ratio: float,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        layer_shapes: Sequence[tuple[int, int]] | None = None,
        swa_layers: Collection[int] = (),
    ) -> float:
        """Bytes per full slot: its full layers' KV plus swa_ratio of a swa slot's (with
        layer_shapes: each layer's own, swa_layers naming the windowed ones)."""
        if layer_shapes is not None:
            per = [TokenToKVPool.bytes_per_token(1, h, d, dtype) for h, d in layer_shapes]
            swa = sum(b for i, b in enumerate(per) if i in swa_layers)
            return sum(per) - swa + swa_ratio * swa
        per_layer = TokenToKVPool.bytes_per_token(1, num_kv_heads, head_dim, dtype)
        return per_layer * (num_full_layers + swa_ratio * num_swa_layers)

    # --- allocator -------------------------------------------------------------
    def clear(self) -> None:
        self.full.clear()
        self.swa.clear()
        self.full_to_swa.zero_()
        self.swa_pins.zero_()

    @property
    def free_slots(self) -> torch.Tensor:
        return self.full.free_slots

    @property
    def free_epoch(self) -> int:
        return self.full.free_epoch + self.swa.free_epoch

    def available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def alloc(self, need: int) -> torch.Tensor | None:
        if need > self.full.available_size() or need > self.swa.available_size():
            return None
        slots = self.full.alloc(need)
        self.full_to_swa[slots] = self.swa.alloc(need)
        return slots

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.free_swa(indices)
        self.full.free(indices)

    def free_swa(self, indices: torch.Tensor) -> int:
        """Free the windowed layers' slots of full slots `indices` (those that have one); -> how
        many were freed."""
        if indices.numel() == 0:
            return 0
        swa = self.full_to_swa[indices]
        held = swa != 0
        n = int(held.sum())
        if n:
            self.swa.free(swa[held])
            self.full_to_swa[indices[held]] = 0
        return n

    def move_swa(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Where full slot dst[i] has no windowed KV and src[i] has (the same token's KV: a
        request's duplicate of what the tree holds), hand src[i]'s swa slot to dst[i]."""
        take = (self.full_to_swa[dst] == 0) & (self.full_to_swa[src] != 0)
        if bool(take.any()):
            self.full_to_swa[dst[take]] = self.full_to_swa[src[take]]
            self.full_to_swa[src[take]] = 0

    def pin(self, indices: torch.Tensor) -> None:
        self.swa_pins[indices] += 1

    def unpin(self, indices: torch.Tensor) -> None:
        self.swa_pins[indices] -= 1

    def evictable_swa(self, indices: torch.Tensor) -> torch.Tensor:
        """Per full slot: it holds windowed KV and no running request's window reads it."""
        return (self.full_to_swa[indices] != 0) & (self.swa_pins[indices] == 0)

    def check(self) -> str | None:
        """Every swa slot free or mapped from exactly one full slot; free full slots map to none; no
        pin on a free slot or below zero."""
        free = self.full.free_slots
        if bool((self.full_to_swa[free] != 0).any()) or bool((self.swa_pins[free] != 0).any()):
            return "a free KV slot keeps a windowed-layer slot or a pin"
        if bool((self.swa_pins < 0).any()):
            return "a windowed-layer pin below zero"
        mapped = self.full_to_swa[self.full_to_swa != 0]
        owners = torch.cat([self.swa.free_slots, mapped])
        counts = torch.bincount(owners, minlength=self.swa_size + 1)
        if counts.numel() > self.swa_size + 1 or counts[0] or bool((counts[1:] != 1).any()):
            bad = (counts[1:] != 1).nonzero().flatten()[:8] + 1
            return f"windowed-layer KV slots without exactly one owner, e.g. {bad.tolist()}"
        return None

    def has_swa(self, indices: torch.Tensor) -> torch.Tensor:
        """Per full slot, whether its windowed layers' KV is held."""
        return self.full_to_swa[indices] != 0

    def translate(self, indices: torch.Tensor) -> torch.Tensor:
        """Full slots -> the swa slots holding their windowed layers' KV (0: none)."""
        return self.full_to_swa[indices]

    # --- data ------------------------------------------------------------------
    def is_swa_layer(self, layer_id: int) -> bool:
        return layer_id in self.swa_layer_ids

    def _pool(self, layer_id: int) -> TokenToKVPool:
        return self.swa if layer_id in self.swa_layer_ids else self.full

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        if layer_id in self.swa_layer_ids:
            self.swa.set_kv_buffer(layer_id, self.full_to_swa[loc], k, v)
        else:
            self.full.set_kv_buffer(layer_id, loc, k, v)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._pool(layer_id).get_kv_buffer(layer_id)

    def get_kv_scales(self, layer_id: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self._pool(layer_id).get_kv_scales(layer_id)

    def release_memory(self) -> None:
        self.full.release_memory()
        self.swa.release_memory()

    def resume_memory(self) -> None:
        self.full.resume_memory()
        self.swa.resume_memory()
