"""Attention over the paged KV pool: the backend interface, the backends, their registry, and
the RadixAttention layer models call."""

from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec
from radixlm.model.layers.attention.hybrid import HybridAttnBackend
from radixlm.model.layers.attention.native import NativeCPUBackend
from radixlm.model.layers.attention.radix_attention import RadixAttention, attention_features
from radixlm.model.layers.attention.registry import (
    ATTENTION_BACKEND_REGISTRY,
    ATTENTION_BACKENDS,
    create_attention_backend,
    register_attention_backend,
    resolve_attention_backends,
)
from radixlm.model.layers.attention.torch_sdpa import TorchSDPABackend

__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_BACKEND_REGISTRY",
    "AttentionBackend",
    "AttentionBackendSpec",
    "HybridAttnBackend",
    "NativeCPUBackend",
    "RadixAttention",
    "TorchSDPABackend",
    "attention_features",
    "create_attention_backend",
    "register_attention_backend",
    "resolve_attention_backends",
]
