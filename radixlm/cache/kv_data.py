"""KVData: the KV of a run of tokens outside the pools, as the tiers of the hierarchical cache
move it (L1 device pool <-> L2 host pool <-> L3 storage).

k, v: [num_layers, tokens, kv_heads, head_dim]; k_scale, v_scale: [num_layers, tokens, kv_heads]
float32 for an int8 cache, else None. The element type is the host tier's (see HostKVPool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

FP16_MAX = 65504.0


@dataclass
class KVData:
    k: torch.Tensor
    v: torch.Tensor
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None

    @property
    def num_tokens(self) -> int:
        return int(self.k.shape[1])

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    @staticmethod
    def cat(parts: list["KVData"]) -> "KVData":
        if len(parts) == 1:
            return parts[0]
        scales = parts[0].k_scale is not None
        return KVData(
            torch.cat([p.k for p in parts], dim=1),
            torch.cat([p.v for p in parts], dim=1),
            torch.cat([p.k_scale for p in parts], dim=1) if scales else None,
            torch.cat([p.v_scale for p in parts], dim=1) if scales else None,
        )


def convert(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as `dtype`; float16 saturates (a value past its range would load back as inf)."""
    if t.dtype == dtype:
        return t
    if dtype == torch.float16 and t.dtype in (torch.float32, torch.bfloat16):
        t = t.clamp(-FP16_MAX, FP16_MAX)
    return t.to(dtype)


def gather_pool(k_buffers, v_buffers, k_scales, v_scales, idx: torch.Tensor, dtype: torch.dtype) -> KVData:
    """The KV at slots `idx` of per-layer buffers ([slots, kv_heads, head_dim] each), as `dtype`."""
    k = torch.stack([convert(b[idx], dtype) for b in k_buffers])
    v = torch.stack([convert(b[idx], dtype) for b in v_buffers])
    if k_scales is None:
        return KVData(k, v)
    return KVData(k, v, torch.stack([s[idx] for s in k_scales]), torch.stack([s[idx] for s in v_scales]))


def scatter_pool(k_buffers, v_buffers, k_scales, v_scales, idx: torch.Tensor, data: KVData) -> None:
    """Write `data` at slots `idx` of per-layer buffers (converting to the buffers' type)."""
    for layer, (kb, vb) in enumerate(zip(k_buffers, v_buffers)):
        kb[idx] = convert(data.k[layer], kb.dtype)
        vb[idx] = convert(data.v[layer], vb.dtype)
        if k_scales is not None:
            k_scales[layer][idx] = data.k_scale[layer]
            v_scales[layer][idx] = data.v_scale[layer]
