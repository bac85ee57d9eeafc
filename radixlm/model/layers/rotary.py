"""Rotary position embedding, neox / HF `rotate_half` style (as HF Llama applies it).

The inverse frequencies follow transformers' `modeling_rope_utils` op for op, so
cos/sin are bit-identical to the reference. Supported `rope_type`s: default,
linear, llama3, yarn, and dynamic (which equals default for every position
below `max_position_embeddings`, and radixlm never runs past that).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from radixlm.kernels.ops import cpu_float_ops

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_parameters(config: Any) -> dict:
    """The rope settings of an HF config as one dict with rope_theta and rope_type.

    transformers 5.x keeps them in `config.rope_parameters` (theta included);
    4.x in `config.rope_scaling` (None when unscaled) plus `config.rope_theta`.
    """
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if "partial_rotary_factor" not in params and getattr(config, "partial_rotary_factor", None):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    return params


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))


def compute_inv_freq(params: dict, dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2], attention_factor applied to cos/sin)."""
    rope_type, base = params["rope_type"], float(params["rope_theta"])
    if rope_type in ("default", "dynamic"):
        return _base_inv_freq(base, dim), 1.0
    if rope_type == "linear":
        return _base_inv_freq(base, dim) / params["factor"], 1.0
    if rope_type == "llama3":
        inv_freq = _base_inv_freq(base, dim)
        factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_ctx = params["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(params, base, dim, max_position)
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def _yarn_inv_freq(params: dict, base: float, dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    orig = params.get("original_max_position_embeddings") or max_position
    factor = params.get("factor") or max_position / orig
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attention_factor


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k of shape [num_tokens, heads * head_dim] at `positions`.

    cos/sin for every position up to max_position are precomputed once (as SGLang
    does), so a forward is one gather, with no device sync to size a cache.
    """

    def __init__(self, head_dim: int, max_position: int, params: dict):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        inv_freq, attention_factor = compute_inv_freq(params, self.rotary_dim, max_position)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = t[:, None] * inv_freq[None, :].float()
        cache = torch.cat((freqs.cos() * attention_factor, freqs.sin() * attention_factor), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_dim)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
        return out.reshape(shape)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        native = cpu_float_ops(q) if q.dim() == 2 and q.stride(1) == 1 and k.stride(1) == 1 else None
        if native is not None:  # in place: q and k are this layer's fresh projections
            native.rotary_embedding_(positions, q, k, self.head_dim, self.cos_sin_cache)
            return q, k
        cos, sin = self.cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


def get_rope(head_dim: int, config: Any) -> RotaryEmbedding:
    """The RotaryEmbedding an HF config asks for."""
    return RotaryEmbedding(head_dim, config.max_position_embeddings, rope_parameters(config))
