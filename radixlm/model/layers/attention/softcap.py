"""Attention through explicit matmuls, for the layer features SDPA has no hook for: soft-capped
scores (Gemma 2's attn_logit_softcapping) and attention sinks (gpt-oss). In HF's op order: scale,
cap, mask, then a float32 softmax whose row may hold one more logit, the head's sink, dropped after
the softmax (it has no value)."""

from __future__ import annotations

import torch


def softcap_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    cap: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [..., kv_heads, r, D] (a KV head's r query rows) over k/v [..., kv_heads, L, D] with a
    boolean mask (True: attend) broadcastable to the scores [..., kv_heads, r, L] -> [..., kv_heads,
    r, D]. cap 0: no soft-cap. sinks: each row's sink logit, broadcastable to the scores' [..., 1].
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if cap:
        scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        sink = sinks.to(torch.float32).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores.float(), sink], -1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)
