"""Hybrid SWA memory (SGLang's name): a model's sliding-window layers keep their KV in a second,
smaller slot space (cache/swa_pool.py), --swa-full-tokens-ratio of the full layers' slots, and a
running request keeps only its window of it. --disable-hybrid-swa-memory, or a part of the server
that reads one slot space, keeps every layer's KV in one pool instead (windows are then a mask
only); the server logs which and why."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.cache.swa_pool import SWATokenToKVPool
from radixlm.model.layers.attention.radix_attention import RadixAttention
from radixlm.model.memory.kv_layout import KVLayout

logger = logging.getLogger(__name__)


def swa_layer_ids(model: nn.Module) -> list[int]:
    """The layer ids of the model's windowed attention layers."""
    return sorted(
        m.layer_id
        for m in model.modules()
        if isinstance(m, RadixAttention) and m.sliding_window_size is not None
    )


HICACHE_ONE_SLOT_SPACE = "the hierarchical cache's tiers copy one slot space"
PP_ONE_SLOT_SPACE = "pp ranks are not built for a second slot space yet"


def server_refusal(args) -> str | None:
    """Why the server's options keep one slot space (None: they allow two). args: ServerArgs."""
    if args.disable_hybrid_swa_memory:
        return "--disable-hybrid-swa-memory"
    for field, why in (
        ("speculative_algorithm", "speculative decoding verifies drafts over one slot space"),
        ("enable_hierarchical_cache", HICACHE_ONE_SLOT_SPACE),
    ):
        if getattr(args, field, None):
            return why
    if getattr(args, "disaggregation_mode", "null") not in (None, "null"):
        return "PD disaggregation transfers one slot space"
    if max(args.tp_size, args.dp_size) > 1:
        return "tp, pp and dp ranks are not built for a second slot space yet"
    if args.pp_size > 1:
        return PP_ONE_SLOT_SPACE
    return None


def model_refusal(runner) -> str | None:
    """Why this model and its kernels keep one slot space for all layers (None: they can have
    two). runner: the ModelRunner being built (its backend and pools' layout chosen)."""
    if runner.state_memory is not None:
        return "a hybrid model's state layers share the pool"
    if runner.kv_layout.mla:
        return "an MLA model's latent pool"
    if not runner.attn_backend.reads_swa_pool:
        return f"the {runner.attn_backend!r} attention backend reads one slot space"
    if runner.config.enable_torch_compile or runner.device.type == "cuda":
        return "decode graphs capture one slot space"
    return None


def check_kv_shapes(runner) -> None:
    """Refuses (ValueError) a model whose layers keep KV of different shapes (KVLayout.layer_shapes:
    Gemma 4) with options that read the pool as one shape: the parts of the server that read one
    slot space (but the hierarchical cache's host tier, which keeps each layer's shape), and every
    backend but the native CPU one."""
    if runner.kv_layout.layer_shapes is None:
        return
    why = runner.config.swa_memory_off
    if why in ("--disable-hybrid-swa-memory", HICACHE_ONE_SLOT_SPACE, PP_ONE_SLOT_SPACE):
        # one slot space of per-layer shapes: the host tier mirrors them (host_pool.py), and a
        # pipeline stage's pool holds its own layers' shapes
        why = None
    if why is None and not runner.attn_backend.reads_swa_pool:
        why = f"the {runner.attn_backend!r} attention backend reads one KV shape"
    if why is None and (runner.config.enable_torch_compile or runner.device.type == "cuda"):
        why = "decode graphs capture one KV shape"
    if why is not None:
        raise ValueError(
            f"{runner.loaded.architecture} keeps KV of different shapes per layer, which this"
            f" server cannot hold yet: {why}"
        )


@dataclass(frozen=True)
class SWAMemory:
    """The windowed layers of a model whose pool gives them their own slots, and the ratio."""

    layers: tuple[int, ...]
    window: int
    ratio: float  # windowed-layer slots per full slot (--swa-full-tokens-ratio)

    @classmethod
    def of(
        cls, model: nn.Module, window: int | None, ratio: float, off: str | None
    ) -> SWAMemory | None:
        """The split for this model, None when it has no windowed layer or `off` says why not."""
        layers = swa_layer_ids(model) if window else []
        if not layers:
            return None
        if off:
            logger.info("hybrid SWA memory off (%s): every layer keeps every token's KV", off)
            return None
        return cls(tuple(layers), window, ratio)

    @staticmethod
    def describe(memory: SWAMemory | None, pool) -> str:
        """The start-up log's words on the split ("" without one)."""
        if memory is None:
            return ""
        return (
            f", of which {len(memory.layers)} sliding-window layers keep {pool.swa_size} tokens"
            f" (window {memory.window})"
        )

    def swa_size(self, size: int) -> int:
        swa = int(size * self.ratio)
        if swa < min(size, 2 * self.window):
            raise ValueError(
                f"swa_full_tokens_ratio {self.ratio}: {swa} windowed-layer KV slots for a pool of"
                f" {size} tokens, fewer than twice the window ({self.window}): raise it, or"
                " --disable-hybrid-swa-memory"
            )
        return swa

    def bytes_per_token(self, num_layers: int, layout: KVLayout, dtype: torch.dtype) -> int:
        """Bytes per full slot, with its share of the windowed layers' slots."""
        n_swa = len(self.layers)
        per = SWATokenToKVPool.split_bytes_per_token(
            num_layers - n_swa,
            n_swa,
            self.ratio,
            layout.num_kv_heads,
            layout.head_dim,
            dtype,
            layout.layer_shapes,
            self.layers,
        )
        return max(1, int(per + 0.5))

    def create_pool(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
        layer_shapes: tuple[tuple[int, int], ...] | None = None,
    ) -> SWATokenToKVPool:
        return SWATokenToKVPool(
            size,
            self.swa_size(size),
            num_layers,
            self.layers,
            num_kv_heads,
            head_dim,
            dtype,
            device,
            window=self.window,
            layer_shapes=layer_shapes,
        )
