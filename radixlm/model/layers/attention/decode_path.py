"""DecodePath: one way TorchSDPABackend attends a decode batch (its requests' one new query each).

The backend holds the enabled paths in order of preference (shared prefix, decode KV mirror,
gather) and gives a batch to the first that plans it. A path works in two halves, so the overlap
scheduler can prepare step N+1 while step N runs: `plan` runs at launch on the scheduler thread
and decides from the bookkeeping alone; `begin_forward` and `forward` run on the forward's thread,
in launch order, and do the data moves and the attention.

Paths that keep a copy of pool KV across steps (the mirror's rows, the shared prefixes' K/V)
share one memory budget, held by one path at a time (TorchSDPABackend enforces it with
`release` and DecodePlan.claims_kv_budget).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.model.layers.attention.softcap import softcap_attention

if TYPE_CHECKING:
    from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixlm.model.layers.attention.radix_attention import RadixAttention


@dataclass
class DecodeBatch:
    """The decode rows of a batch (a DECODE batch, or the tail of a MIXED one) at launch."""

    req_pool_indices: torch.Tensor  # [bs]
    seq_lens: torch.Tensor  # [bs] on the pool's device
    seq_lens_cpu: list[int]
    # [bs, max_len] each request's pool slots in position order (padded with stale slots): a copy
    # of the req_to_token rows taken at launch, which the scheduler may rewrite while a step runs.
    kv_indices: torch.Tensor
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool

    @property
    def max_len(self) -> int:
        return self.kv_indices.shape[1]


@dataclass(kw_only=True)
class DecodePlan:
    """A decode batch as one path planned it; the backend keeps it in the batch's metadata."""

    path: DecodePath = field(repr=False)  # the path that made the plan and runs it
    # The plan starts holding the budget the kept KV copies share: the other paths let go of theirs.
    claims_kv_budget: bool = False


class DecodePath(ABC):
    @abstractmethod
    def plan(self, batch: DecodeBatch) -> DecodePlan | None:
        """At launch, on the scheduler thread: the plan for batch, or None when this path does not
        serve it. Must not touch data a running forward uses."""

    def release(self) -> DecodePlan | None:
        """At launch: let go of the KV kept across steps (another path serves the batch, or claims
        the budget). Returns a plan whose begin_forward frees the memory, or None when nothing is
        to be done on the forward's thread."""
        return None

    def begin_forward(self, plan: DecodePlan, kv_pool: TokenToKVPool) -> None:
        """On the forward's thread, in launch order, before the first layer: the plan's data
        moves."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        plan: DecodePlan,
        kv_pool: TokenToKVPool,
    ) -> torch.Tensor:
        """One layer: q [bs, heads, D] (k, v: the new tokens' [bs, kv_heads, D], already in the
        pool) -> [bs, heads, D]."""

    def reset(self) -> None:
        """Forget state kept across steps (a forward failed half way)."""

    def __repr__(self) -> str:
        return type(self).__name__


def gather_kv(buf: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """buf[indices] for a pool buffer [slots, heads, D]: index_select on a 2-D view is
    ~4x faster on CPU than advanced indexing (the gather dominates decode there). CPU pools are
    stored head-major (memory_pool.TokenToKVPool): gather each head's rows there."""
    if not buf.is_contiguous():
        rows = buf.transpose(0, 1).index_select(1, indices.reshape(-1))  # [heads, n, D]
        return rows.transpose(0, 1).reshape(*indices.shape, *buf.shape[1:])
    rows = buf.view(buf.shape[0], -1).index_select(0, indices.reshape(-1))
    return rows.view(*indices.shape, *buf.shape[1:])


def padding_mask(seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """[bs, 1, 1, max_len]: True at each request's own positions, False over the padding."""
    arange = torch.arange(max_len, device=seq_lens.device)
    return (arange[None, :] < seq_lens[:, None]).view(len(seq_lens), 1, 1, max_len)


def window_mask(seq_lens: torch.Tensor, max_len: int, window: int) -> torch.Tensor:
    """padding_mask, with the keys outside the newest token's window (positions <= seq_len - 1 -
    window) masked out too: [bs, 1, 1, max_len]."""
    arange = torch.arange(max_len, device=seq_lens.device)[None, :]
    ok = (arange < seq_lens[:, None]) & (arange >= seq_lens[:, None] - window)
    return ok.view(len(seq_lens), 1, 1, max_len)


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, layer: RadixAttention
) -> torch.Tensor:
    """decode_sdpa, or for a layer with a logit cap or sinks the explicit attention (same
    shapes)."""
    if not layer.logit_cap and layer.sinks is None:
        return decode_sdpa(q, k, v, mask, layer.scaling)
    bs, heads, d = q.shape
    kvh = k.shape[1]
    sinks = None if layer.sinks is None else layer.sinks.view(kvh, heads // kvh, 1)
    o = softcap_attention(
        q.view(bs, kvh, heads // kvh, d), k, v, mask, layer.scaling, layer.logit_cap, sinks
    )
    return o.reshape(bs, heads, d)


def decode_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """One new token per request: q [bs, heads, D] over k/v [bs, kv_heads, L, D] -> [bs, heads, D].
    The query heads sharing a KV head go in as that head's query rows, so K/V are read once per KV
    head (SDPA's enable_gqa reads them once per query head: ~1.3x slower here; repeat_interleave
    of K/V ~15x). The mask [bs, 1, 1, L] is the same for every row."""
    bs, heads, d = q.shape
    kvh = k.shape[1]
    o = F.scaled_dot_product_attention(
        q.view(bs, kvh, heads // kvh, d), k, v, attn_mask=mask, scale=scale
    )
    return o.reshape(bs, heads, d)
