"""The absorbed MLA decode as one native CPU op (kernels/csrc/mla_decode.cpp: the latents of each
request read once for all heads, long sequences split across cores), where it applies."""

from __future__ import annotations

import torch

from radixlm.kernels.ops import cpu_float_ops

_POOL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def mla_decode_native(
    q_lat: torch.Tensor,
    latent_buf: torch.Tensor,
    kv_indices: torch.Tensor,
    lens: torch.Tensor,
    kv_lora_rank: int,
    scaling: float,
) -> torch.Tensor | None:
    """o_lat [B, heads, kv_lora_rank] float32, or None where the op does not apply (float32 queries
    on CPU, widths that are multiples of 8, a float pool): the caller's torch path runs then."""
    ops = cpu_float_ops(q_lat)
    d = q_lat.shape[-1]
    if (
        ops is None
        or not hasattr(ops, "mla_decode")
        or d % 8
        or kv_lora_rank % 8
        or latent_buf.dtype not in _POOL_DTYPES
        or latent_buf.stride(-1) != 1
    ):
        return None
    return ops.mla_decode(
        q_lat.contiguous(),
        latent_buf,
        kv_indices.contiguous(),
        lens.contiguous(),
        kv_lora_rank,
        scaling,
    )
