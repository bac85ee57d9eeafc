"""MLATokenToKVPool: the KV pool of a multi-head latent attention model (DeepSeek-V2/V3).

Per token and layer it stores ONE vector of kv_lora_rank + qk_rope_head_dim elements: the
normalized latent c_kv followed by the rotated decoupled RoPE key k_pe (SGLang's MLATokenToKVPool
layout), instead of per-head K and V. It is a TokenToKVPool whose K buffer holds that vector as
a single "KV head" and whose V buffers are zero wide (v_head_dim 0), so the allocator, the radix
cache, retraction and the hierarchical tiers (which copy k_buffer / v_buffer slot ranges, and size
themselves from num_kv_heads, head_dim and v_head_dim) work on it unchanged. Values come from the
latent itself (the attention backend decompresses it with kv_b_proj, or absorbs W_UV).

DeepSeek-V3.2 (index_head_dim > 0) adds its sparse-attention indexer's key to the same row, after
the latent: a slot's whole entry is [c_kv | k_pe | index_k], so whatever shares or copies a slot
(the radix tree's prefixes, the host tiers' k_buffer ranges) carries the indexer's key with it.
"""

from __future__ import annotations

import torch

from radixlm.cache.memory_pool import TokenToKVPool, kv_dtype_name, scaled_kv


class MLATokenToKVPool(TokenToKVPool):
    def __init__(
        self,
        size: int,
        num_layers: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        layers: range | None = None,
        index_head_dim: int = 0,
    ):
        if scaled_kv(dtype):
            raise ValueError(
                f"kv_cache_dtype {kv_dtype_name(dtype)} is not supported with"
                " an MLA (latent) KV cache; use auto, float16 or bfloat16"
            )
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.index_head_dim = index_head_dim
        self.size, self.num_layers = size, num_layers
        self.layers = range(num_layers) if layers is None else layers
        self.num_kv_heads, self.head_dim, self.v_head_dim = (
            1,
            kv_lora_rank + qk_rope_head_dim + index_head_dim,
            0,
        )
        self.layer_shapes = None  # one latent per token in every layer
        self.dtype, self.device = dtype, torch.device(device)
        self.k_scale_buffer = self.v_scale_buffer = None
        self._allocate()
        self.clear()

    def _allocate(self) -> None:
        heads = lambda i: 1 if i in self.layers else 0
        self.k_buffer = [
            self._buffer((self.size + 1, heads(i), self.head_dim)) for i in range(self.num_layers)
        ]
        self.v_buffer = [
            torch.zeros((self.size + 1, heads(i), 0), dtype=self.dtype, device=self.device)
            for i in range(self.num_layers)
        ]

    @staticmethod
    def latent_bytes_per_token(
        num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: torch.dtype
    ) -> int:
        return (
            num_layers
            * (kv_lora_rank + qk_rope_head_dim)
            * torch.tensor([], dtype=dtype).element_size()
        )

    @property
    def total_bytes(self) -> int:
        return self.latent_bytes_per_token(
            len(self.layers),
            self.kv_lora_rank,
            self.qk_rope_head_dim + self.index_head_dim,
            self.dtype,
        ) * (self.size + 1)

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None
    ) -> None:
        """k: [tokens, 1, head_dim] (latent | k_pe, then index_k where kept); there is no V."""
        self.k_buffer[layer_id][loc] = k.to(self.dtype)

    def get_latent_buffer(self, layer_id: int) -> torch.Tensor:
        """[slots, kv_lora_rank + qk_rope_head_dim] of one layer (a view)."""
        return self.k_buffer[layer_id][:, 0, : self.kv_lora_rank + self.qk_rope_head_dim]

    def get_index_k_buffer(self, layer_id: int) -> torch.Tensor:
        """[slots, index_head_dim] of one layer: the NSA indexer's keys (a view)."""
        return self.k_buffer[layer_id][:, 0, self.kv_lora_rank + self.qk_rope_head_dim :]

    def release_memory(self) -> None:
        empty = torch.empty((0, 1, self.head_dim), dtype=self.dtype, device=self.device)
        self.k_buffer = [empty] * self.num_layers
        self.v_buffer = [empty[:, :, :0]] * self.num_layers

    def resume_memory(self) -> None:
        self._allocate()
