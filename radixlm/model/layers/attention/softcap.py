"""Attention with the scores soft-capped (Gemma 2's attn_logit_softcapping): SDPA has no hook
between the product and the softmax, so these layers take explicit matmuls, in HF's op order
(scale, cap, mask, float32 softmax)."""

from __future__ import annotations

import torch


def softcap_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, cap: float
) -> torch.Tensor:
    """q [..., kv_heads, r, D] (a KV head's r query rows) over k/v [..., kv_heads, L, D] with a
    boolean mask (True: attend) broadcastable to the scores [..., kv_heads, r, L] -> [..., kv_heads,
    r, D].
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
