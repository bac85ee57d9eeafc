"""Kernels of the layers that keep a recurrent state instead of a KV cache (docs/hybrid.md):
the causal conv1d with its state, the gated delta rule (Gated DeltaNet: Qwen3.5, Qwen3-Next) and
the Mamba-2 SSD scan (Nemotron-H, Granite-4.0-H, Falcon-H1), behind one interface
(`base.LinearAttnBackend`) chosen by --linear-attn-backend."""

from radixlm.model.layers.linear_attn.base import (
    LINEAR_ATTN_BACKEND_REGISTRY,
    LinearAttnBackend,
    create_linear_attn_backend,
)

__all__ = ["LINEAR_ATTN_BACKEND_REGISTRY", "LinearAttnBackend", "create_linear_attn_backend"]
