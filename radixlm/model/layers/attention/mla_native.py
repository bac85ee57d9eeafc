"""The absorbed MLA decode as one native CPU op (kernels/csrc/mla_decode.cpp), where it applies."""

from __future__ import annotations

from typing import Optional

import torch


def mla_decode_native(q_lat: torch.Tensor, latent_buf: torch.Tensor, kv_indices: torch.Tensor, lens: torch.Tensor,
                      kv_lora_rank: int, scaling: float) -> Optional[torch.Tensor]:
    """o_lat [B, heads, kv_lora_rank], or None where the op does not apply (the caller's torch path runs)."""
    return None
