"""Rotary position embedding, neox / HF `rotate_half` style (as HF Llama applies it).

The inverse frequencies follow transformers' `modeling_rope_utils` op for op, so
cos/sin are bit-identical to the reference. Supported `rope_type`s: default,
linear, llama3, yarn, dynamic (which equals default for every position
below `max_position_embeddings`, and radixlm never runs past that), proportional (Gemma 4's global
layers: a partial rotation whose frequencies keep the whole head's spacing), and longrope
(Phi-3's; "su" in older configs), whose factor set depends on the sequence's length
(LongRopeRotaryEmbedding). Qwen2-VL's M-RoPE (`mrope_section`: three positions per token) is
MRotaryEmbedding.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixlm.kernels.ops import fused_ops

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch

SUPPORTED_ROPE_TYPES = (
    "default",
    "linear",
    "dynamic",
    "llama3",
    "yarn",
    "longrope",
    "proportional",
)
LONGROPE_TYPES = ("longrope", "su")  # "su": the name in Phi-3's first configs


def rope_parameters(config: Any) -> dict:
    """The rope settings of an HF config as one dict with rope_theta and rope_type.

    transformers 5.x keeps them in `config.rope_parameters` (theta included);
    4.x in `config.rope_scaling` (None when unscaled) plus `config.rope_theta`.
    """
    params = dict(
        getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    )
    params.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if "partial_rotary_factor" not in params and getattr(config, "partial_rotary_factor", None):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    if params["rope_type"] in LONGROPE_TYPES and getattr(
        config, "original_max_position_embeddings", None
    ):
        # Phi-3 keeps it beside rope_scaling; transformers gives that value priority.
        params["original_max_position_embeddings"] = config.original_max_position_embeddings
    return params


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))


def compute_inv_freq(
    params: dict, dim: int, max_position: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2], attention_factor applied to cos/sin). seq_len matters to longrope
    only."""
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
    if rope_type == "proportional":  # Gemma 4's global layers
        return _proportional_inv_freq(params, base, dim), 1.0
    if rope_type in LONGROPE_TYPES:
        return _longrope_inv_freq(params, base, dim, max_position, seq_len)
    raise ValueError(
        f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _proportional_inv_freq(params: dict, base: float, dim: int) -> torch.Tensor:
    """The first partial_rotary_factor of the frequencies at the whole head's spacing, the rest 0
    (those dimensions do not rotate): the rotation spans the whole head (rotary_dim = head_dim)."""
    angles = int(params.get("partial_rotary_factor", 1.0) * dim // 2)
    exps = torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(torch.float) / dim
    inv_freq = torch.cat((1.0 / (base**exps), torch.zeros(dim // 2 - angles)))
    return inv_freq / params.get("factor", 1.0)


def _yarn_inv_freq(
    params: dict, base: float, dim: int, max_position: int
) -> tuple[torch.Tensor, float]:
    orig = params.get("original_max_position_embeddings") or max_position
    factor = params.get("factor") or max_position / orig
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(
                get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            )
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
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, attention_factor


def _longrope_inv_freq(
    params: dict, base: float, dim: int, max_position: int, seq_len: int | None
) -> tuple[torch.Tensor, float]:
    # transformers' _compute_longrope_parameters: the long factors past the original context.
    orig = params["original_max_position_embeddings"]
    factor, attention_factor = params.get("factor"), params.get("attention_factor")
    if factor is None:  # Phi-3 states the ratio as max_position_embeddings / original
        factor = max_position / orig
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        )
    long = seq_len and seq_len > orig
    ext_factors = torch.tensor(
        params["long_factor"] if long else params["short_factor"], dtype=torch.float32
    )
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * base**inv_freq_shape), attention_factor


def cos_sin_table(
    inv_freq: torch.Tensor, attention_factor: float, num_positions: int
) -> torch.Tensor:
    """[num_positions, rotary_dim]: cos | sin of every position, scaled as transformers scales
    them."""
    t = torch.arange(num_positions, dtype=torch.float32)
    freqs = t[:, None] * inv_freq[None, :].float()
    return torch.cat((freqs.cos() * attention_factor, freqs.sin() * attention_factor), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k of shape [num_tokens, heads * head_dim] at `positions`.

    cos/sin for every position up to max_position are precomputed once (as SGLang
    does), so a forward is one gather, with no device sync to size a cache.
    """

    def __init__(self, head_dim: int, max_position: int, params: dict):
        super().__init__()
        self.head_dim = head_dim
        partial = params.get("partial_rotary_factor", 1.0)
        if params["rope_type"] == "proportional":  # (partial in its frequencies, not its width)
            partial = 1.0
        self.rotary_dim = int(head_dim * partial)
        self.register_buffer(
            "cos_sin_cache", self._build_cache(params, max_position), persistent=False
        )

    def _build_cache(self, params: dict, max_position: int) -> torch.Tensor:
        return cos_sin_table(*compute_inv_freq(params, self.rotary_dim, max_position), max_position)

    def cache_rows(self, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """The cos_sin_cache row of each token: its position (LongRopeRotaryEmbedding differs)."""
        return positions

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
        return self._apply(positions, q, k, self.cos_sin_cache)

    def _apply(
        self, rows: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates each token by row `rows[i]` of the table `cos_sin` [rows, rotary_dim]."""
        native = fused_ops(q) if q.dim() == 2 and q.stride(1) == 1 and k.stride(1) == 1 else None
        if (
            native is not None
        ):  # in place: q and k are this layer's fresh projections (Triton's on CUDA)
            native.rotary_embedding_(rows, q, k, self.head_dim, cos_sin)
            return q, k
        cos, sin = cos_sin[rows].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


class LongRopeRotaryEmbedding(RotaryEmbedding):
    """longrope: a request uses the short factors while its sequence fits the original context
    (original_max_position_embeddings) and the long ones past it.

    transformers decides per forward (max(position_ids) + 1 > original): a prompt longer than the
    original context is prefilled with the long factors, a shorter one with the short ones, and a
    forward over a KV cache that crosses the original length rotates its new tokens with the long
    ones while the cached keys keep theirs. Deciding per request from its length after this
    forward does the same for every request, whatever else is batched with it. (transformers'
    generate goes further: at the crossing it drops its cache and recomputes the whole sequence
    with the long factors; radixlm keeps the cached keys, which the radix tree may share.)
    The cache holds both tables: short rows [0, original), then long rows original + position
    (vLLM's layout), so a token's row is one gather for the torch path and the native ops alike.
    """

    def _build_cache(self, params: dict, max_position: int) -> torch.Tensor:
        self.original_max_position = orig = int(params["original_max_position_embeddings"])
        short = compute_inv_freq(params, self.rotary_dim, max_position)
        long = compute_inv_freq(params, self.rotary_dim, max_position, seq_len=orig + 1)
        return torch.cat((cos_sin_table(*short, orig), cos_sin_table(*long, max_position)))

    def cache_rows(self, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        orig = self.original_max_position
        is_long = [n > orig for n in forward_batch.seq_lens_cpu]
        if not any(is_long):
            return positions
        if all(is_long):
            return positions + orig
        # Extend-shaped batches (MIXED's decodes included) list their new tokens; decode has one
        # each.
        new_tokens = (
            forward_batch.extend_seq_lens_cpu if forward_batch.forward_mode.is_extend() else None
        )
        offsets = torch.tensor(
            [orig if x else 0 for x in is_long], dtype=positions.dtype, device=positions.device
        )
        if new_tokens is None:
            return positions + offsets
        counts = torch.tensor(new_tokens, dtype=torch.int64, device=positions.device)
        return positions + torch.repeat_interleave(offsets, counts, output_size=positions.shape[0])


class MRotaryEmbedding(RotaryEmbedding):
    """M-RoPE (Qwen2-VL): three positions per token (temporal, height, width:
    model/executor/mrope.py, in ForwardBatch.mrope_positions); the rotary frequencies split into
    `mrope_section` parts, part i turning with position i % 3 (transformers' recomposition).
    `mrope_interleaved` (Qwen3-VL, Qwen3.5): frequency j turns with height where j % 3 == 1 and j <
    3 * section[1], with width where j % 3 == 2 and j < 3 * section[2], else with time. A batch
    without images has none: its three positions are equal, which is plain RoPE at the token's
    position."""

    def __init__(self, head_dim: int, max_position: int, params: dict):
        super().__init__(head_dim, max_position, params)
        section = [int(n) for n in params["mrope_section"]]
        if sum(section) != self.rotary_dim // 2:
            raise ValueError(
                f"mrope_section {section} must add up to half the rotary dims"
                f" ({self.rotary_dim // 2})"
            )
        if params.get("mrope_interleaved"):
            which = torch.zeros(self.rotary_dim // 2, dtype=torch.int64)
            for axis in (1, 2):
                which[axis : 3 * section[axis] : 3] = axis
        else:
            which = torch.tensor([i % 3 for i, n in enumerate(section) for _ in range(n)])
        self.register_buffer(
            "column_position", torch.cat([which, which]), persistent=False
        )  # cos | sin
        self._last: tuple[Any, Any] = (
            None,
            None,
        )  # (positions, their per-token table): one per forward

    def cache_rows(self, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """[3, tokens] where the batch has images, else the 1-D positions."""
        mrope = forward_batch.mrope_positions
        return positions if mrope is None else mrope

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().forward(positions, q, k)
        if self._last[0] is not positions:  # every layer of a forward gets the same tensor
            n = positions.shape[1]
            rows = self.cos_sin_cache[positions]  # [3, tokens, rotary_dim]
            self._last = (
                positions,
                rows.gather(0, self.column_position.view(1, 1, -1).expand(1, n, -1))[0],
            )
        table = self._last[1]  # [tokens, rotary_dim]: token i's cos | sin, row i
        return self._apply(torch.arange(table.shape[0], device=table.device), q, k, table)


def get_rope(head_dim: int, config: Any) -> RotaryEmbedding:
    """The RotaryEmbedding an HF config asks for."""
    params = rope_parameters(config)
    cls = LongRopeRotaryEmbedding if params["rope_type"] in LONGROPE_TYPES else RotaryEmbedding
    if params.get("mrope_section"):
        cls = MRotaryEmbedding
    return cls(head_dim, config.max_position_embeddings, params)


def interleaved_to_rotate_half(w, head_dim: int, rotary_dim: int | None = None):
    """q / k projection rows (a weight or a bias) of each head from RoPE's interleaved pairs
    (2i, 2i + 1) over its first rotary_dim dims (None: all of them) to the rotate_half order
    (i, i + rotary_dim / 2) RotaryEmbedding applies (GLM-4, Cohere: HF rotates interleaved pairs).
    q and k move alike, so every score is unchanged; a quantized matrix moves whole rows (its
    blocks run along the input)."""
    from radixlm.model.layers.quantized import QuantizedTensor

    rotary_dim = rotary_dim or head_dim
    order = torch.cat(
        [
            torch.arange(0, rotary_dim, 2),
            torch.arange(1, rotary_dim, 2),
            torch.arange(rotary_dim, head_dim),
        ]
    )
    rows = w.data if isinstance(w, QuantizedTensor) else w
    heads = rows.shape[0] // head_dim
    out = rows.reshape(heads, head_dim, -1)[:, order].reshape(rows.shape).contiguous()
    return QuantizedTensor(out, w.fmt, w.cols) if isinstance(w, QuantizedTensor) else out
