"""The draft head's attention during one proposal: each request's committed KV (the head's own pool,
read through the target's slots) plus what this proposal computes (its catch-up rows, then the tree
nodes it expands), each query row seeing the committed KV, the catch-up rows up to its own, and its
tree ancestors.

HeadKVPool holds the head's K and V per layer at the target's KV slot indices (SGLang shares the
slot allocator the same way): a request's cached prefix brings the head's KV of those positions
with it, written when some earlier request computed them, and the target's allocator alone decides
when a slot is free. Each slot is tagged with what its entry was computed from (its position and
the next token, which the head read there); a prefix entry whose tag is not the request's own (the
position where the request parted from the one that wrote it, a slot reused since, one never
written: a request that never drafted, a prefix loaded back from the host tier) is left out of the
attention rather than read stale. Tree nodes never enter the pool: their K/V lives in the
proposal's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class HeadKVPool:
    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (size + 1, num_kv_heads, head_dim)  # slot 0 is the target pool's padding slot
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.tags = torch.full(
            (size + 1, 2), -1, dtype=torch.int64, device=device
        )  # (position, next token)
        self.dtype = dtype

    def valid(
        self, slots: torch.Tensor, positions: torch.Tensor, next_tokens: torch.Tensor
    ) -> torch.Tensor:
        """Which of these slots hold the head's KV of exactly (position, next token)."""
        tags = self.tags[slots]
        return (tags[:, 0] == positions) & (tags[:, 1] == next_tokens)

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass(eq=False)
class RequestKV:
    """One request's keys and values for this proposal, per layer: [prefix | catch-up rows | tree
    nodes]."""

    prefix: int  # committed positions read from the pool
    catch_up: int  # rows computed (and written to the pool) by this proposal
    k: list[torch.Tensor]  # per layer [capacity, kv_heads, head_dim] float
    v: list[torch.Tensor]
    prefix_valid: (
        torch.Tensor
    )  # [prefix] bool: the pool's entry is this request's (HeadKVPool.valid)
    used: int = 0  # filled entries
    node_entry: dict[int, int] = field(default_factory=dict)  # tree node -> its entry


class ProposalAttention:
    """Attention for the head's forwards of one proposal, request by request (their rows are
    consecutive in every batch)."""

    def __init__(self, pool: HeadKVPool, scaling: float):
        self.pool = pool
        self.scaling = scaling
        self.reqs: list[RequestKV] = []
        # The current batch: per request its rows (start, count) and per row the entries it sees
        # beyond the prefix and catch-up rows (None: causal over the catch-up rows).
        self._batch: list[tuple[RequestKV, int, int, list]] = []
        self._slots: list[torch.Tensor] = []
        self._last_layer = len(pool.k) - 1  # the layer after which the batch's entries are used

    def add_request(
        self, prefix_slots: torch.Tensor, tokens: torch.Tensor, catch_up: int, max_nodes: int
    ) -> RequestKV:
        """prefix_slots: the slots of positions 0 .. n - 1 before the catch-up rows; tokens: the
        request's tokens (at least n + 1: the entry at t read the token at t + 1)."""
        n = prefix_slots.numel()
        cap = n + catch_up + max_nodes
        ks, vs = [], []
        for k_pool, v_pool in zip(self.pool.k, self.pool.v):
            k = k_pool.new_empty((cap,) + k_pool.shape[1:], dtype=torch.float32)
            v = torch.empty_like(k)
            n = prefix_slots.numel()
            if n:
                k[:n] = k_pool[prefix_slots]
                v[:n] = v_pool[prefix_slots]
            ks.append(k)
            vs.append(v)
        positions = torch.arange(n, device=prefix_slots.device)
        valid = self.pool.valid(prefix_slots, positions, tokens[1 : n + 1].to(prefix_slots.device))
        r = RequestKV(n, catch_up, ks, vs, valid, used=n)
        self.reqs.append(r)
        return r

    def set_batch(
        self,
        parts: list[tuple[RequestKV, int, list]],
        slots: list[torch.Tensor],
        tags: list[torch.Tensor] | None = None,
        last_layer: int | None = None,
    ) -> None:
        """parts: per request (its KV, rows in this batch, per row the entries it sees or None
        for catch-up rows); slots: per request the pool slots its rows' K/V go to (catch-up rows),
        else empty, and tags: per request the (position, next token) of each of those rows.
        last_layer: the last layer this batch runs (chained heads run one layer each, the catch-up
        all of them in turn); default the head's last."""
        self._last_layer = len(self.pool.k) - 1 if last_layer is None else last_layer
        self._batch, start = [], 0
        for r, n, sees in parts:
            self._batch.append((r, start, n, sees))
            start += n
        self._slots = slots
        for slot, tag in zip(slots, tags or ()):
            self.pool.tags[slot] = tag

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
    ) -> torch.Tensor:
        rows, heads, dim = q.shape
        kvh = k.shape[1]
        out = torch.empty(rows, heads * dim, dtype=q.dtype, device=q.device)
        for (r, start, n, sees), slots in zip(self._batch, self._slots):
            first = (
                r.used
            )  # every layer appends at the same entries; used moves after the last layer
            kk, vv = r.k[layer], r.v[layer]
            kk[first : first + n] = k[start : start + n]
            vv[first : first + n] = v[start : start + n]
            if slots.numel():
                self.pool.k[layer][slots] = k[start : start + n].to(self.pool.dtype)
                self.pool.v[layer][slots] = v[start : start + n].to(self.pool.dtype)
            keys = first + n
            mask = torch.zeros(n, keys, dtype=torch.bool, device=q.device)
            mask[:, : r.prefix] = r.prefix_valid
            if sees is None:  # catch-up rows: everything before them and themselves, causally
                mask[:, r.prefix : first] = True
                mask[:, first:] = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            else:  # tree nodes: the prefix, the catch-up rows, their ancestors and themselves
                mask[:, r.prefix : r.prefix + r.catch_up] = True
                for i, entries in enumerate(sees):
                    mask[i, entries] = True
                    mask[i, first + i] = True
            # Per kv head, its query heads' rows stacked (group member, row): a few rows against
            # many keys, where explicit matmuls beat SDPA's CPU kernel by ~2x.
            qq = (
                q[start : start + n]
                .view(n, kvh, heads // kvh, dim)
                .permute(1, 2, 0, 3)
                .reshape(kvh, -1, dim)
            )
            scores = torch.bmm(qq, kk[:keys].permute(1, 2, 0)).mul_(self.scaling)
            scores.masked_fill_(~mask.repeat(heads // kvh, 1), float("-inf"))
            att = torch.bmm(torch.softmax(scores, dim=-1), vv[:keys].transpose(0, 1))
            out[start : start + n] = (
                att.view(kvh, heads // kvh, n, dim).permute(2, 0, 1, 3).reshape(n, heads * dim)
            )
            if layer == self._last_layer:
                r.used = keys
        return out
