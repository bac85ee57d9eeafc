"""RadixAttention: the attention op of one layer, the one models call.

It stores the new tokens' K/V in the pool and hands the attention to the batch's backend
(forward_batch.attn_backend, set by whoever builds the ForwardBatch: ModelRunner.prepare).

Three per-layer properties (SGLang's names) change what a query sees:
- sliding_window_size: a query at position p attends keys at positions > p - window (HF's
  sliding_window_overlay: the window counts the query itself); None: every earlier key.
- logit_cap: scores become cap * tanh(scores / cap) before the mask and softmax (Gemma 2); 0: off.
- sinks: attention sinks (gpt-oss), a learned logit per query head that joins each row's softmax
  denominator and has no value: a query may give part of its attention to nothing. The layer owns
  them as a float32 parameter [heads] (this rank's heads); None: off.
- attention_chunk_size: Llama 4's chunked attention, a query at position p attends keys of its own
  chunk only ([p - p % chunk, p]: a window that restarts at each chunk boundary); None: off.
The KV pool keeps every token either way (windowed layers read only part of it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        logit_cap: float = 0.0,
        sliding_window_size: int | None = None,
        sinks: bool = False,
        attention_chunk_size: int | None = None,
    ):
        super().__init__()
        for name, value in (
            ("sliding_window_size", sliding_window_size),
            ("attention_chunk_size", attention_chunk_size),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value}")
        if sliding_window_size is not None and attention_chunk_size is not None:
            raise ValueError("a layer has a sliding window or an attention chunk, not both")
        self.attention_chunk_size = attention_chunk_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling, self.layer_id = scaling, layer_id
        self.logit_cap = float(logit_cap or 0.0)
        self.sliding_window_size = sliding_window_size
        # float32 whatever the model's dtype: HF adds them to float32 scores.
        self.sinks = (
            nn.Parameter(torch.empty(num_heads, dtype=torch.float32), requires_grad=False)
            if sinks
            else None
        )

    def forward(
        self, q, k, v, forward_batch: ForwardBatch, save_kv_cache: bool = True
    ) -> torch.Tensor:
        """q: [T, heads * D], k/v: [T, kv_heads * D] -> [T, heads * D]. save_kv_cache False: k/v
        are already in the pool at layer_id (a layer reading an earlier layer's KV: Gemma 4)."""
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(
                self.layer_id, forward_batch.out_cache_loc, k, v
            )
        backend = forward_batch.attn_backend
        if forward_batch.forward_mode.is_decode():
            o = backend.forward_decode(q, k, v, self, forward_batch)
        else:
            o = backend.forward_extend(q, k, v, self, forward_batch)
        return o.reshape(-1, self.num_heads * self.head_dim)


class AttentionFeatures(NamedTuple):
    """What a backend must support to run a model (AttentionBackendSpec)."""

    sliding_window_size: int | None  # the windowed layers' window; None: no windowed layer
    logit_cap: float  # the largest logit cap; 0: none
    sinks: bool  # some layer has attention sinks
    attention_chunk_size: int | None = None  # the chunked layers' chunk (Llama 4); None: none


def attention_features(layers: Iterable[nn.Module]) -> AttentionFeatures:
    """The attention features of a model's modules. Every windowed layer of a supported model has
    the same window; a backend builds its window masks once per batch."""
    windows, chunks, cap, sinks = set(), set(), 0.0, False
    for m in layers:
        if isinstance(m, RadixAttention):
            if m.sliding_window_size is not None:
                windows.add(m.sliding_window_size)
            if m.attention_chunk_size is not None:
                chunks.add(m.attention_chunk_size)
            cap = max(cap, m.logit_cap)
            sinks = sinks or m.sinks is not None
    for kind, sizes in (("sliding windows", windows), ("attention chunks", chunks)):
        if len(sizes) > 1:
            raise ValueError(f"layers with different {kind} {sorted(sizes)} are not supported")
    return AttentionFeatures(
        windows.pop() if windows else None, cap, sinks, chunks.pop() if chunks else None
    )
