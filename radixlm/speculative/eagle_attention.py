"""The draft head's attention during one proposal: each request's committed KV (the head's own pool,
read through the target's slots) plus what this proposal computes (its catch-up rows, then the tree
nodes it expands), each query row seeing the committed KV, the catch-up rows up to its own, and its
tree ancestors.

HeadKVPool holds the head's K and V per layer at the target's KV slot indices (SGLang shares the
slot allocator the same way): a request's cached prefix brings the head's KV of those positions
with it, written when some earlier request computed them, and the target's allocator alone decides
when a slot is free. Tree nodes never enter the pool: their K/V lives in the proposal's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class HeadKVPool:
    def __init__(self, size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (size + 1, num_kv_heads, head_dim)  # slot 0 is the target pool's padding slot
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.dtype = dtype

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass(eq=False)
class RequestKV:
    """One request's keys and values for this proposal, per layer: [prefix | catch-up rows | tree nodes]."""

    prefix: int  # committed positions read from the pool
    catch_up: int  # rows computed (and written to the pool) by this proposal
    k: list[torch.Tensor]  # per layer [capacity, kv_heads, head_dim] float
    v: list[torch.Tensor]
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

    def add_request(self, prefix_slots: torch.Tensor, catch_up: int, max_nodes: int) -> RequestKV:
        cap = prefix_slots.numel() + catch_up + max_nodes
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
        r = RequestKV(prefix_slots.numel(), catch_up, ks, vs, used=prefix_slots.numel())
        self.reqs.append(r)
        return r

    def set_batch(self, parts: list[tuple[RequestKV, int, list]], slots: list[torch.Tensor]) -> None:
        """parts: per request (its KV, rows in this batch, per row the tree nodes it sees or None for
        catch-up rows); slots: per request the pool slots its rows' K/V go to (catch-up rows), else empty."""
        self._batch, start = [], 0
        for r, n, sees in parts:
            self._batch.append((r, start, n, sees))
            start += n
        self._slots = slots

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        rows, heads, dim = q.shape
        kvh = k.shape[1]
        out = torch.empty(rows, heads * dim, dtype=q.dtype, device=q.device)
        for (r, start, n, sees), slots in zip(self._batch, self._slots):
            first = r.used  # every layer appends at the same entries; used moves after the last layer
            kk, vv = r.k[layer], r.v[layer]
            kk[first:first + n] = k[start:start + n]
            vv[first:first + n] = v[start:start + n]
            if slots.numel():
                self.pool.k[layer][slots] = k[start:start + n].to(self.pool.dtype)
                self.pool.v[layer][slots] = v[start:start + n].to(self.pool.dtype)
            keys = first + n
            mask = torch.zeros(n, keys, dtype=torch.bool, device=q.device)
            if sees is None:  # catch-up rows: everything before them and themselves, causally
                mask[:, :first] = True
                mask[:, first:] = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            else:  # tree nodes: the prefix, the catch-up rows, their ancestors and themselves
                mask[:, :r.prefix + r.catch_up] = True
                for i, entries in enumerate(sees):
                    mask[i, entries] = True
                    mask[i, first + i] = True
            # Per kv head, its query heads' rows stacked (group member, row): a few rows against many
            # keys, where explicit matmuls beat SDPA's CPU kernel by ~2x.
            qq = q[start:start + n].view(n, kvh, heads // kvh, dim).permute(1, 2, 0, 3).reshape(kvh, -1, dim)
            scores = torch.bmm(qq, kk[:keys].permute(1, 2, 0)).mul_(self.scaling)
            scores.masked_fill_(~mask.repeat(heads // kvh, 1), float("-inf"))
            att = torch.bmm(torch.softmax(scores, dim=-1), vv[:keys].transpose(0, 1))
            out[start:start + n] = att.view(kvh, heads // kvh, n, dim).permute(2, 0, 1, 3).reshape(n, heads * dim)
            if layer == len(self.pool.k) - 1:
                r.used = keys
        return out
