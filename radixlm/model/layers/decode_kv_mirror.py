"""A dense copy of the decoding requests' KV, so decode attention reads it without a gather.

The pool keeps each token's K/V at a scattered slot (radix-cache sharing needs that), and torch
has no paged-attention op on the CPU: the plain decode path gathers every request's whole context
into a padded [bs, max_len] block, in every layer, at every step. That copy costs about as much
as the attention itself (docs/benchmarks.md). Here each decoding request keeps a row of dense
per-layer buffers [rows, kv_heads, capacity, head_dim] (head-major: the layout SDPA reads
fastest), filled from the pool once when the request starts decoding; each step then only writes
its new token, to the pool and to the row.

Rows are keyed by (request slot, the slot's allocation generation), so a reused request slot never
sees an earlier request's KV, and a request whose KV grew outside decode (an extend step after a
jump-forward) is refilled. The batch's rows are kept at 0..bs-1 (in any order), so attention runs
on one view of the buffers. The buffers never exceed `max_bytes`; a batch that would is served by
the gather path instead.
"""

from __future__ import annotations

from typing import Optional

import torch

_GROW = 256  # capacity grows in steps of this many tokens


class DecodeKVMirror:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.k: list = []  # per layer [rows, kv_heads, capacity, head_dim]
        self.v: list = []
        self.owner: list[Optional[tuple[int, int]]] = []  # (req slot, generation) per row
        self.length: list[int] = []  # tokens present per row
        # Set by prepare() for the current batch:
        # [bs] row of each batch entry, and the batch entry held by rows 0..bs-1; None when row b
        # holds batch entry b.
        self.row_of: Optional[torch.Tensor] = None
        self.batch_of_row: Optional[torch.Tensor] = None
        self.write_pos: Optional[torch.Tensor] = None  # [bs] position of the new token (batch order)
        self.rows_in_order = torch.arange(0)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def release(self) -> None:
        self.k, self.v, self.owner, self.length = [], [], [], []

    def prepare(self, req_pool_indices: list[int], seq_lens: list[int], req_to_token_pool, kv_pool) -> bool:
        """Arrange rows 0..bs-1 to hold the batch's requests with every token but the new one.
        False (and the buffers released) when that would take more than max_bytes."""
        bs, need_cap = len(seq_lens), max(seq_lens)
        per_token = kv_pool.bytes_per_token(kv_pool.num_layers, kv_pool.num_kv_heads, kv_pool.head_dim, kv_pool.dtype)
        need = -(-need_cap // _GROW) * _GROW
        if bs * need * per_token > self.max_bytes:
            self.release()
            return False
        if max(bs, len(self.owner)) * max(need, self.capacity) * per_token > self.max_bytes:
            self.release()  # grown past the budget: start over at the size this batch needs
        self._ensure(bs, max(need, self.capacity), kv_pool)
        gens = req_to_token_pool.generation
        keys = [(i, gens[i]) for i in req_pool_indices]
        row_by_key = {k: r for r, k in enumerate(self.owner) if k is not None}
        wanted = set(keys)
        for r, k in enumerate(self.owner):  # rows of requests that left the batch
            if k is not None and k not in wanted:
                self.owner[r] = None
        rows: list[Optional[int]] = [row_by_key.get(k) for k in keys]
        # Compact: rows at or beyond bs move into free rows below bs.
        free = [r for r in reversed(range(bs)) if self.owner[r] is None]  # pop() yields ascending rows
        for b, r in enumerate(rows):
            if r is not None and r >= bs:
                dst = free.pop()
                for buf in self.k + self.v:
                    buf[dst, :, : self.length[r]] = buf[r, :, : self.length[r]]
                self.owner[dst], self.length[dst], self.owner[r] = self.owner[r], self.length[r], None
                rows[b] = dst
        for b, (key, r) in enumerate(zip(keys, rows)):
            n = seq_lens[b] - 1
            if r is None:
                r = rows[b] = free.pop()
            if self.owner[r] != key or self.length[r] != n:
                self._fill(r, req_to_token_pool.req_to_token[key[0], :n], kv_pool)
            self.owner[r], self.length[r] = key, n + 1  # the forward writes token n in every layer
        device = kv_pool.device
        if rows == list(range(bs)):  # rows in batch order (the usual case): no reordering
            self.row_of = self.batch_of_row = None
        else:
            self.row_of = torch.tensor(rows, dtype=torch.int64, device=device)
            order = [0] * bs
            for b, r in enumerate(rows):
                order[r] = b
            self.batch_of_row = torch.tensor(order, dtype=torch.int64, device=device)
        self.write_pos = torch.tensor([s - 1 for s in seq_lens], dtype=torch.int64, device=device)
        if len(self.rows_in_order) < bs:
            self.rows_in_order = torch.arange(bs, device=device)
        return True

    def _ensure(self, rows: int, cap: int, kv_pool) -> None:
        rows = max(rows, len(self.owner))
        if self.k and rows <= self.k[0].shape[0] and cap <= self.capacity:
            return
        kvh, d = kv_pool.num_kv_heads, kv_pool.head_dim
        if not self.k:
            self.k, self.v = [None] * kv_pool.num_layers, [None] * kv_pool.num_layers
        for bufs in (self.k, self.v):
            for layer, old in enumerate(bufs):  # layer by layer: the old buffer goes as the new one comes
                # Zeros, not empty: masked positions are still multiplied in, and garbage may be NaN.
                new = torch.zeros((rows, kvh, cap, d), dtype=kv_pool.dtype, device=kv_pool.device)
                if old is not None:
                    keep = min(old.shape[2], cap)
                    new[: old.shape[0], :, :keep] = old[:, :, :keep]
                bufs[layer] = new
        self.owner += [None] * (rows - len(self.owner))
        self.length += [0] * (rows - len(self.length))

    def _fill(self, row: int, slots: torch.Tensor, kv_pool) -> None:
        n = slots.numel()
        for layer in range(kv_pool.num_layers):
            k_buf, v_buf = kv_pool.get_kv_buffer(layer)
            self.k[layer][row, :, :n] = k_buf.index_select(0, slots).transpose(0, 1)
            self.v[layer][row, :, :n] = v_buf.index_select(0, slots).transpose(0, 1)

    def write_and_view(self, layer: int, k: torch.Tensor, v: torch.Tensor, max_len: int):
        """Store the batch's new k/v [bs, kv_heads, D] (batch order); return the layer's
        [bs, kv_heads, max_len, D] views of rows 0..bs-1 (row order)."""
        bs = k.shape[0]
        kd, vd = self.k[layer], self.v[layer]
        rows = self.row_of if self.row_of is not None else self.rows_in_order[:bs]
        kd[rows, :, self.write_pos] = k
        vd[rows, :, self.write_pos] = v
        return kd[:bs, :, :max_len], vd[:bs, :, :max_len]
