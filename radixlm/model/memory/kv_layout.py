"""The KV pool layout a model needs, read off its attention layers: per-head K and V
(TokenToKVPool), or one latent vector per token for multi-head latent attention
(MLATokenToKVPool: DeepSeek-V2/V3). The runner sizes and builds its pool through this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.mla_pool import MLATokenToKVPool
from radixlm.model.layers.attention.mla_attention import MLAAttention
from radixlm.model.layers.attention.radix_attention import RadixAttention

# A model without KV (a state-space model: models/mamba.py) still numbers its tokens' slots for the
# radix tree; each costs its free-list entry and its request-row and tree indices, about this much.
# It sizes the slot count (and the states' share of the budget) as KV bytes per token would.
NO_KV_TOKEN_SLOT_BYTES = 256


@dataclass(frozen=True)
class KVLayout:
    num_kv_heads: int  # this rank's KV heads (1 for a latent pool)
    head_dim: int  # K's width per head (the latent + RoPE key's for MLA)
    kv_lora_rank: int = 0  # > 0: an MLA latent pool
    qk_rope_head_dim: int = 0
    # MLA only: what ordinary multi-head caching of the same model would hold per layer and token
    # (heads x (qk_head_dim + v_head_dim) elements), for the start-up report.
    mha_elems_per_layer: int = 0
    # Per layer id (kv_heads, head_dim) where the layers' shapes differ (Gemma 4: 512-dim global
    # heads beside 256-dim sliding ones; 0 heads: a layer that reads another layer's KV); None:
    # num_kv_heads x head_dim everywhere (then the widest).
    layer_shapes: tuple[tuple[int, int], ...] | None = None
    index_head_dim: int = 0  # DeepSeek-V3.2: the NSA indexer's key, kept in the latent's row

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def bytes_per_token(self, num_layers: int, dtype: torch.dtype) -> int:
        if self.num_kv_heads == 0:  # no KV at all (kv_layout's state-space model)
            return NO_KV_TOKEN_SLOT_BYTES
        if self.mla:
            return MLATokenToKVPool.latent_bytes_per_token(
                num_layers, self.kv_lora_rank, self.qk_rope_head_dim + self.index_head_dim, dtype
            )
        if self.layer_shapes is not None:  # (a pipeline stage's: the others' layers hold 0 heads)
            return TokenToKVPool.shaped_bytes_per_token(self.layer_shapes, dtype)
        return TokenToKVPool.bytes_per_token(num_layers, self.num_kv_heads, self.head_dim, dtype)

    def mha_bytes_per_token(self, num_layers: int, dtype: torch.dtype) -> int:
        """The same model's KV bytes per token with per-head K and V (MHA caching)."""
        if not self.mla:
            return self.bytes_per_token(num_layers, dtype)
        return num_layers * self.mha_elems_per_layer * torch.tensor([], dtype=dtype).element_size()

    def create_pool(
        self,
        size: int,
        num_layers: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        layers: range | None = None,
    ) -> TokenToKVPool:
        if self.mla:
            return MLATokenToKVPool(
                size,
                num_layers,
                self.kv_lora_rank,
                self.qk_rope_head_dim,
                dtype,
                device,
                layers,
                self.index_head_dim,
            )
        return TokenToKVPool(
            size,
            num_layers,
            self.num_kv_heads,
            self.head_dim,
            dtype,
            device,
            layers=layers,
            layer_shapes=self.layer_shapes,
        )


def held_kv_layers(model: nn.Module) -> list[int]:
    """The KV-pool layer ids this model's attention writes (a pipeline stage's share of a hybrid,
    whose attention layers are numbered among themselves)."""
    return sorted({m.layer_id for m in model.modules() if isinstance(m, RadixAttention)})


def kv_layout(model: nn.Module, hf_config: Any) -> KVLayout:
    attn = next((m for m in model.modules() if isinstance(m, RadixAttention)), None)
    if attn is None and model.traits().num_kv_layers == 0:
        return KVLayout(0, 0)  # a state-space model (models/mamba.py): token slots without KV
    if attn is None:  # an encoder (model/models/bert.py): keeps no KV; a pool of its heads' shape
        heads = hf_config.num_attention_heads
        return KVLayout(heads, hf_config.hidden_size // heads)
    shapes = layer_shapes(model, hf_config.num_hidden_layers)
    if shapes is not None:
        heads, dim = max(h for h, _ in shapes), max(d for _, d in shapes)
        return KVLayout(heads, dim, layer_shapes=shapes)
    if isinstance(attn, MLAAttention):
        return KVLayout(
            1,
            attn.head_dim,
            attn.kv_lora_rank,
            attn.qk_rope_head_dim,
            attn.num_heads * (attn.qk_head_dim + attn.v_head_dim),
            index_head_dim=attn.index_head_dim,
        )
    head_dim = (
        getattr(hf_config, "head_dim", None)
        or hf_config.hidden_size // hf_config.num_attention_heads
    )
    return KVLayout(attn.num_kv_heads, head_dim)


def layer_shapes(model: nn.Module, num_layers: int) -> tuple[tuple[int, int], ...] | None:
    """Each layer id's (kv_heads, head_dim) where the model's attention layers differ in shape or
    some layers keep no KV of their own (`model.kv_shared_layers`: they read an earlier layer's,
    which their RadixAttention.layer_id names); None where every layer keeps the same shape."""
    shapes: dict[int, tuple[int, int]] = {}
    for m in model.modules():
        if isinstance(m, RadixAttention) and not isinstance(m, MLAAttention):
            shape = (m.num_kv_heads, m.head_dim)
            if shapes.setdefault(m.layer_id, shape) != shape:
                raise ValueError(
                    f"layers reading layer {m.layer_id}'s KV disagree on its shape (kv heads,"
                    f" head dim): {shapes[m.layer_id]} and {shape}"
                )
    shared = model.traits().kv_shared_layers
    if not shapes or (len(set(shapes.values())) == 1 and not shared):
        return None
    dim = max(d for _, d in shapes.values())
    return tuple(shapes.get(i, (0, dim)) for i in range(num_layers))
