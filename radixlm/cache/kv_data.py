"""KVData: the KV of a run of tokens outside the pools, as the tiers of the hierarchical cache
move it (L1 device pool <-> L2 host pool <-> L3 storage).

k, v: [num_layers, tokens, kv_heads, head_dim]; k_scale, v_scale: [num_layers, tokens, kv_heads]
float32 for an int8 cache, else None. The element type is the host tier's (see HostKVPool).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FP16_MAX = 65504.0


@dataclass
class KVData:
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.k.shape[1])

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    @staticmethod
    def cat(parts: list[KVData]) -> KVData:
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


# Past this many runs of consecutive slots a copy goes through index_select / index_put instead.
MAX_RUNS = 64


def _runs(dst_idx: torch.Tensor, src_idx: torch.Tensor) -> list[tuple[int, int, int]] | None:
    """(dst start, src start, length) of the maximal runs where both index lists go up by one;
    None when there are more than MAX_RUNS (a fragmented pool)."""
    n = dst_idx.numel()
    if n == 0:
        return []
    brk = (
        ((dst_idx[1:] - dst_idx[:-1] != 1) | (src_idx[1:] - src_idx[:-1] != 1)).nonzero().flatten()
    )
    if brk.numel() >= MAX_RUNS:
        return None
    bounds = [0] + (brk + 1).tolist() + [n]
    heads = torch.tensor(bounds[:-1])
    d0, s0 = dst_idx[heads].tolist(), src_idx[heads].tolist()
    return [(d, s_, e - b) for d, s_, b, e in zip(d0, s0, bounds[:-1], bounds[1:])]


def copy_slots(
    dst: list[torch.Tensor], dst_idx: torch.Tensor, src: list[torch.Tensor], src_idx: torch.Tensor
) -> None:
    """dst[layer][dst_idx] = src[layer][src_idx] for every layer, converting the element type.
    Pools hand out slots in long consecutive runs, so this is mostly a few slice copies per layer
    (~5x faster than index_put on these CPUs)."""
    runs = _runs(dst_idx.cpu(), src_idx.cpu())
    for d, s_ in zip(dst, src):
        if runs is None:
            if not _copy_on_this_thread(d, dst_idx, s_, src_idx):
                d[dst_idx.to(d.device)] = convert(s_[src_idx.to(s_.device)], d.dtype).to(d.device)
            continue
        for a, b, n in runs:
            part = s_[b : b + n]
            if _copy_on_this_thread(d[a : a + n], None, part, None):
                continue
            if d.dtype == torch.float16 and part.dtype != torch.float16:
                part = convert(part, d.dtype)
            d[a : a + n].copy_(part)


# Same-size views numpy can copy (it has no bfloat16).
_NUMPY_VIEW = {torch.bfloat16: torch.int16}


def _copy_on_this_thread(
    d: torch.Tensor, d_idx: torch.Tensor | None, s_: torch.Tensor, s_idx: torch.Tensor | None
) -> bool:
    """d[d_idx] = s_[s_idx] (whole tensors when the indices are None) through numpy, on the calling
    thread: False when numpy cannot (another device, a bfloat16 conversion). These copies are
    memory-bound, so torch's intra-op team gains little on them (7 against 13 ms for 3,300 tokens of
    the default model, idle); under CPU contention each of its parallel regions waits for a
    descheduled team thread: the same copy beside 4 busy processes took up to 7.2 s in a server,
    35-65 ms this way (docs/benchmarks.md, "a prefix from disk under CPU contention")."""
    if d.device.type != "cpu" or s_.device.type != "cpu":
        return False
    if d.dtype == s_.dtype and d.dtype in _NUMPY_VIEW:
        d, s_ = d.view(_NUMPY_VIEW[d.dtype]), s_.view(_NUMPY_VIEW[d.dtype])
    elif torch.bfloat16 in (d.dtype, s_.dtype):
        return False
    a, b = d.numpy(), s_.numpy()
    if s_idx is not None:
        b = b[s_idx.numpy()]
    if d.dtype == torch.float16 and s_.dtype != torch.float16:
        b = np.clip(b, -FP16_MAX, FP16_MAX)  # saturate, as convert() does
    if d_idx is None:
        np.copyto(a, b, casting="unsafe")
    else:
        a[d_idx.numpy()] = b
    return True


def gather(layers_k, layers_v, scales_k, scales_v, idx: torch.Tensor, dtype: torch.dtype) -> KVData:
    """A new KVData holding the KV at slots idx of per-layer buffers, as `dtype`."""
    n, seq = idx.numel(), torch.arange(idx.numel())
    shape = (len(layers_k), n, *layers_k[0].shape[1:])
    v_shape = (
        *shape[:3],
        layers_v[0].shape[2],
    )  # V may be narrower than K (an MLA latent pool: none)
    out = KVData(torch.empty(shape, dtype=dtype), torch.empty(v_shape, dtype=dtype))
    if scales_k is not None:
        out.k_scale, out.v_scale = (torch.empty(shape[:3]) for _ in range(2))
    for dst, src in zip(out.tensors(), (layers_k, layers_v, scales_k, scales_v)):
        copy_slots(list(dst), seq, src, idx)
    return out


def scatter(layers_k, layers_v, scales_k, scales_v, idx: torch.Tensor, data: KVData) -> None:
    """Write `data` at slots idx of per-layer buffers."""
    seq = torch.arange(idx.numel())
    for dst, src in zip((layers_k, layers_v, scales_k, scales_v), data.tensors()):
        copy_slots(dst, idx, list(src), seq)
