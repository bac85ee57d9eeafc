"""The attention backend interface, and the spec a backend is chosen and built from.

K/V of a request live at scattered slots of TokenToKVPool; `req_to_token[row, :len]` lists them in
position order. A backend reads them from there, so a prefix cached by another request (radix
cache) is attended exactly like one computed now.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch
    from radixlm.model.layers.attention.radix_attention import RadixAttention


@dataclass(frozen=True)
class AttentionBackendSpec:
    """What decides whether a backend can run a model, and what it is built with."""

    head_dim: int
    dtype: torch.dtype  # the model's (the queries')
    kv_dtype: torch.dtype  # the KV pool's
    device: torch.device
    shared_prefix: bool = True  # torch: decode reads a prefix shared by a group of requests once
    mirror_bytes: int = 0  # torch: budget of the dense decode KV copy (0: off)
    # The model's attention features (radix_attention.attention_features): the window of its
    # windowed layers (None: none), its largest attention logit soft-cap (0: none), whether some
    # layer has attention sinks.
    sliding_window_size: int | None = None
    logit_cap: float = 0.0
    sinks: bool = False
    attention_chunk_size: int | None = None  # Llama 4's chunked layers (the native kernel only)
    # Multi-head latent attention (DeepSeek-V2/V3): the pool holds one latent per token
    # (cache/mla_pool.py); only backends built for it (mla_backend.py) run such a model.
    mla: bool = False


class AttentionBackend(ABC):
    """Computes attention for one layer; K/V of the new tokens are already in the pool.

    q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
    (the new tokens' own K/V, which a backend may use instead of re-reading the
    pool). Returns [num_tokens, num_heads, head_dim]. A MIXED batch comes to forward_extend;
    its last forward_batch.num_decode rows are decode queries. A TARGET_VERIFY batch of draft
    trees carries forward_batch.tree_mask (model/tree_mask.py): each new token attends its prefix
    and the new tokens its mask block allows, at position prefix + its depth.
    """

    # Whether forward_extend honours forward_batch.tree_mask for the model it was built for; a
    # backend that cannot says False and the scheduler drafts chains only.
    supports_tree_mask = True
    # Whether forward_extend lets the tokens of one image span attend each other both ways where
    # the request's MultimodalInputs.bidirectional says so (Gemma 3; bidirectional.py).
    supports_bidirectional_spans = False
    # Whether a windowed layer's KV is read through SWATokenToKVPool.translate (cache/swa_pool.py:
    # the windowed layers' own slot space); a backend that reads one slot space says False and the
    # runner keeps every layer's KV in it.
    reads_swa_pool = False

    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Per-batch precompute (indices, masks) shared by all layers, stored in
        forward_batch.attn_metadata. The scheduler calls it when it launches the batch (on its
        own thread, while another step may still run), so it reads the request rows as they are
        at launch; it must not touch data a running forward uses."""

    def begin_forward(self, forward_batch: ForwardBatch) -> None:
        """Called by the model at the start of each forward, on the thread that runs it: builds
        the metadata if nobody did, then performs any data moves the metadata planned."""
        if forward_batch.attn_metadata is None:
            self.init_forward_metadata(forward_batch)

    def reset(self) -> None:
        """Forget state kept across steps (a forward failed half way)."""

    @abstractmethod
    def forward_extend(
        self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """EXTEND, MIXED and TARGET_VERIFY batches."""

    @abstractmethod
    def forward_decode(
        self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """DECODE batches: one query per request."""

    def runs_fused_layers(self, forward_batch: ForwardBatch) -> bool:
        """Whether a model may run all its layers through the native fused op
        (model/layers/fused_layers.py) for this batch: the op reads the native backend's metadata.
        """
        return False

    def __repr__(self) -> str:
        return type(self).__name__
