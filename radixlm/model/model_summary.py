"""The start-up line that says what model is served: its architecture, experts, total and active
parameters, and the KV cache's bytes per token (against ordinary per-head caching for MLA)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from radixlm.model.memory.kv_layout import KVLayout


@runtime_checkable
class _MoELayer(Protocol):
    routing: Any  # its top_k
    experts: Any


@runtime_checkable
class _Experts(Protocol):
    num_experts: int


@runtime_checkable
class _EPExperts(Protocol):
    num_local: int  # the experts this rank holds (--ep-size)


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(total, active per token) of the whole model: a MoE layer's routed experts count top_k /
    num_experts toward the active parameters (modules with `routing.top_k` and
    `experts.num_experts`; a rank holding `experts.num_local` of them under --ep-size counts them
    all)."""
    total = float(sum(p.numel() for p in model.parameters()))
    inactive = 0.0
    for m in model.modules():
        if not isinstance(m, _MoELayer) or m.routing is None:
            continue
        routing, experts = m.routing, m.experts
        if not isinstance(experts, _Experts):
            continue
        held = sum(p.numel() for p in experts.parameters())
        local = experts.num_local if isinstance(experts, _EPExperts) else experts.num_experts
        n = held * experts.num_experts / local
        total += n - held
        inactive += n * (1 - routing.top_k / experts.num_experts)
    return int(total), int(total - inactive)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def summary(
    architecture: str,
    model: nn.Module,
    hf_config: Any,
    layout: KVLayout,
    num_layers: int,
    kv_dtype: torch.dtype,
) -> str:
    total, active = parameter_counts(model)
    experts = getattr(hf_config, "n_routed_experts", None) or getattr(
        hf_config, "num_experts", None
    )
    parts = [architecture]
    if experts:
        shared = getattr(hf_config, "n_shared_experts", None)
        top_k = getattr(hf_config, "num_experts_per_tok", None) or getattr(
            hf_config, "top_k_experts", None
        )  # (Gemma 4's name)
        zero = getattr(hf_config, "zero_expert_num", None)  # LongCat-Flash's identity experts
        parts.append(
            f"{experts} routed experts, top-{top_k}"
            + (f", {shared} shared" if shared else "")
            + (f", {zero} zero-computation" if zero else "")
        )
    parts.append(f"params {_count(total)} total, {_count(active)} active")
    per_token = layout.bytes_per_token(num_layers, kv_dtype)
    kv = f"KV {per_token} bytes/token"
    if layout.mla:
        mha = layout.mha_bytes_per_token(num_layers, kv_dtype)
        index = f" + indexer key {layout.index_head_dim}" if layout.index_head_dim else ""
        kv += (
            f" (MLA latent {layout.kv_lora_rank}+{layout.qk_rope_head_dim}{index}; MHA would be"
            f" {mha}, {100 * (1 - per_token / mha):.1f}% less)"
        )
    parts.append(kv)
    return "; ".join(parts)
