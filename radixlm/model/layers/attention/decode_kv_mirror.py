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
another decode path instead (decode_kv_mirror_path.py).

Two halves, so the overlap scheduler can prepare step N+1 while step N runs: `plan` (on the
scheduler thread, at launch) decides rows from the bookkeeping alone and returns the data moves;
`apply` (on the thread that runs the forward, in launch order) performs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_GROW = 256  # capacity grows in steps of this many tokens


@dataclass
class MirrorPlan:
    use: bool  # False: a release only (no batch reads the mirror)
    release: bool = False  # drop the buffers before anything else
    rows: int = 0  # buffers must have at least this many rows ...
    cap: int = 0  # ... and this capacity
    moves: list[tuple[int, int, int]] = field(default_factory=list)  # (src row, dst row, length)
    fills: list[tuple[int, torch.Tensor]] = field(
        default_factory=list
    )  # (row, pool slots) filled from the pool
    # [bs] row of each batch entry, and the batch entry held by rows 0..bs-1; None when row b holds
    # entry b.
    row_of: torch.Tensor | None = None
    batch_of_row: torch.Tensor | None = None
    write_pos: torch.Tensor | None = None  # [bs] position of the new token (batch order)
    rows_in_order: torch.Tensor | None = None


class DecodeKVMirror:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        # Bookkeeping (plan): what the rows will hold once every planned step has run.
        self.owner: list[tuple[int, int] | None] = []  # (req slot, generation) per row
        self.length: list[int] = []  # tokens present per row
        self.cap = 0
        # Data (apply): per layer [rows, kv_heads, capacity, head_dim].
        self.k: list = []
        self.v: list = []

    def plan_release(self) -> MirrorPlan:
        self.owner, self.length, self.cap = [], [], 0
        return MirrorPlan(use=False, release=True)

    def plan(
        self,
        req_pool_indices: list[int],
        generations: list[int],
        seq_lens: list[int],
        slot_rows: torch.Tensor,
        kv_pool,
    ) -> MirrorPlan | None:
        """Arrange rows 0..bs-1 to hold the batch's requests with every token but the new one.
        slot_rows: [bs, >= max(seq_lens)] the requests' pool slots. None, with nothing changed,
        when that would take more than max_bytes (the caller then lets the rows go: plan_release).
        """
        bs, need_cap = len(seq_lens), max(seq_lens)
        per_token = kv_pool.bytes_per_token(
            kv_pool.num_layers, kv_pool.num_kv_heads, kv_pool.head_dim, kv_pool.dtype
        )
        need = -(-need_cap // _GROW) * _GROW
        if bs * need * per_token > self.max_bytes:
            return None
        plan = MirrorPlan(use=True)
        if max(bs, len(self.owner)) * max(need, self.cap) * per_token > self.max_bytes:
            self.plan_release()  # grown past the budget: start over at the size this batch needs
            plan.release = True
        self.cap = max(need, self.cap)
        if len(self.owner) < bs:
            self.owner += [None] * (bs - len(self.owner))
            self.length += [0] * (bs - len(self.length))
        plan.rows, plan.cap = len(self.owner), self.cap
        keys = list(zip(req_pool_indices, generations))
        row_by_key = {k: r for r, k in enumerate(self.owner) if k is not None}
        wanted = set(keys)
        for r, k in enumerate(self.owner):  # rows of requests that left the batch
            if k is not None and k not in wanted:
                self.owner[r] = None
        rows: list[int | None] = [row_by_key.get(k) for k in keys]
        # Compact: rows at or beyond bs move into free rows below bs.
        free = [
            r for r in reversed(range(bs)) if self.owner[r] is None
        ]  # pop() yields ascending rows
        for b, r in enumerate(rows):
            if r is not None and r >= bs:
                dst = free.pop()
                plan.moves.append((r, dst, self.length[r]))
                self.owner[dst], self.length[dst], self.owner[r] = (
                    self.owner[r],
                    self.length[r],
                    None,
                )
                rows[b] = dst
        for b, (key, r) in enumerate(zip(keys, rows)):
            n = seq_lens[b] - 1
            if r is None:
                r = rows[b] = free.pop()
            if self.owner[r] != key or self.length[r] != n:
                plan.fills.append((r, slot_rows[b, :n]))
            self.owner[r], self.length[r] = key, n + 1  # the forward writes token n in every layer
        device = kv_pool.device
        if rows == list(range(bs)):  # rows in batch order (the usual case): no reordering
            plan.rows_in_order = torch.arange(bs, device=device)
        else:
            plan.row_of = torch.tensor(rows, dtype=torch.int64, device=device)
            order = [0] * bs
            for b, r in enumerate(rows):
                order[r] = b
            plan.batch_of_row = torch.tensor(order, dtype=torch.int64, device=device)
        plan.write_pos = torch.tensor([s - 1 for s in seq_lens], dtype=torch.int64, device=device)
        return plan

    def apply(self, plan: MirrorPlan, kv_pool) -> None:
        if plan.release:
            self.k, self.v = [], []
        if not plan.use:
            return
        self._ensure(plan.rows, plan.cap, kv_pool)
        for src, dst, n in plan.moves:
            for buf in self.k + self.v:
                buf[dst, :, :n] = buf[src, :, :n]
        for row, slots in plan.fills:
            n = slots.numel()
            for layer in range(kv_pool.num_layers):
                k_buf, v_buf = kv_pool.get_kv_buffer(layer)
                self.k[layer][row, :, :n] = k_buf.index_select(0, slots).transpose(0, 1)
                self.v[layer][row, :, :n] = v_buf.index_select(0, slots).transpose(0, 1)

    def _ensure(self, rows: int, cap: int, kv_pool) -> None:
        if self.k and rows <= self.k[0].shape[0] and cap <= self.k[0].shape[2]:
            return
        kvh, d = kv_pool.num_kv_heads, kv_pool.head_dim
        if not self.k:
            self.k, self.v = [None] * kv_pool.num_layers, [None] * kv_pool.num_layers
        for bufs in (self.k, self.v):
            for layer, old in enumerate(
                bufs
            ):  # layer by layer: the old buffer goes as the new one comes
                # Zeros, not empty: masked positions are still multiplied in, and garbage may be
                # NaN.
                new = torch.zeros(
                    (max(rows, 0 if old is None else old.shape[0]), kvh, cap, d),
                    dtype=kv_pool.dtype,
                    device=kv_pool.device,
                )
                if old is not None:
                    keep = min(old.shape[2], cap)
                    new[: old.shape[0], :, :keep] = old[:, :, :keep]
                bufs[layer] = new

    def write_and_view(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, max_len: int, plan: MirrorPlan
    ):
        """Store the batch's new k/v [bs, kv_heads, D] (batch order); return the layer's
        [bs, kv_heads, max_len, D] views of rows 0..bs-1 (row order)."""
        bs = k.shape[0]
        kd, vd = self.k[layer], self.v[layer]
        rows = plan.row_of if plan.row_of is not None else plan.rows_in_order
        kd[rows, :, plan.write_pos] = k
        vd[rows, :, plan.write_pos] = v
        return kd[:bs, :, :max_len], vd[:bs, :, :max_len]
