"""LoRARuntime: the adapters of the scheduler process and the batched delta; NoLoRA without
--enable-lora. BaseLoRARuntime is what the runner, admission and the LoRA control calls ask of
either.

Each target linear layer gets a forward hook (the model's code is unchanged): after the base layer's
output (float, or the native quantized kernels'), the hook adds scale * (x A^T) B^T for the tokens
of each adapter in the batch. begin_forward gives the delta (delta.py, chosen for the device at
start-up) the batch's segments: one per request, under its adapter's slot. On CPU a layer then runs
one native op for the whole batch (float32; each token's delta independent of its batch), else one
shrink and one expand per adapter (its tokens gathered by index); on CUDA one segmented launch
each for the whole batch. A batch without adapter tokens skips every hook (and may run the fused
decoder op).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Protocol

import torch
from torch import nn

from radixlm.lora.adapter import AdapterError, LoRAAdapter, load_adapter
from radixlm.lora.config import LoRAConfig, LoRARef
from radixlm.lora.delta import create_lora_delta
from radixlm.lora.pool import LoRAPool


class ForwardBatch(Protocol):
    """What begin_forward reads of model/forward_batch.py: ForwardBatch (lora sits below the
    model)."""

    lora_ids: list  # per request, its adapter's uid (None: the base model)
    extend_seq_lens_cpu: list[int] | None  # new tokens per request (None: one each, a decode)
    input_ids: torch.Tensor


logger = logging.getLogger(__name__)


LORA_OFF = "LoRA is off: start the server with --enable-lora"


class BaseLoRARuntime(ABC):
    max_loras_per_batch: int  # distinct adapters (the base model counting as one) a batch may mix

    @abstractmethod
    def begin_forward(self, fb: ForwardBatch) -> None:
        """This batch's segments: per request, its adapter's slot and tokens."""

    @abstractmethod
    def fits(self, lora_ids: set) -> bool:
        """Whether a batch of these adapters (None: the base model) may run."""

    @abstractmethod
    def serves(self, uid: str | None) -> bool:
        """Whether a request for adapter uid (None: the base model) can run."""

    @abstractmethod
    def adapters_info(self) -> list[dict]:
        """The loaded adapters, for /get_server_info and the LoRA control calls."""

    @abstractmethod
    def load(self, ref: LoRARef) -> LoRAAdapter:
        """Load and check an adapter (AdapterError naming what is wrong)."""

    @abstractmethod
    def unload(self, uid: str) -> None:
        """Drop a loaded adapter (AdapterError when there is none of that uid)."""


class NoLoRA(BaseLoRARuntime):
    """LoRA off: nothing to prepare, every batch fits, no adapter loads."""

    max_loras_per_batch = 0

    def begin_forward(self, fb: ForwardBatch) -> None:
        pass

    def fits(self, lora_ids: set) -> bool:
        return True

    def serves(self, uid: str | None) -> bool:
        return uid is None

    def adapters_info(self) -> list[dict]:
        return []

    def load(self, ref: LoRARef) -> LoRAAdapter:
        raise AdapterError(LORA_OFF)

    def unload(self, uid: str) -> None:
        raise AdapterError(LORA_OFF)


class LoRARuntime(BaseLoRARuntime):
    def __init__(
        self, config: LoRAConfig, model: nn.Module, dtype: torch.dtype, device: torch.device
    ):
        self.config, self.dtype = config, dtype
        self.max_loras_per_batch = config.max_loras_per_batch
        initial = [load_adapter(ref, dtype) for ref in config.adapters]
        rank = config.max_lora_rank or max(a.rank for a in initial)
        targets = config.target_modules or frozenset().union(*(a.targets for a in initial))
        self.pool = LoRAPool(
            model, config.max_loras_per_batch, rank, targets, config.eviction_policy, dtype, device
        )
        self.adapters: dict[str, LoRAAdapter] = {}
        for a in initial:
            self._add(a)
        self._layers = {id(t.module): t for t in self.pool.layers}
        for t in self.pool.layers:
            t.module.register_forward_hook(self._hook)
        self.delta = create_lora_delta(torch.device(device), dtype)
        logger.info(
            "LoRA: %d target layers, rank %d, %d slots (%.1f MiB), adapters %s",
            len(self.pool.layers),
            rank,
            config.max_loras_per_batch,
            self.pool.nbytes / 2**20,
            [a.ref.lora_name for a in initial],
        )

    # ------------------------------------------------------------ adapters
    def load(self, ref: LoRARef) -> LoRAAdapter:
        limit = self.config.max_loaded_loras
        if limit is not None and len(self.adapters) >= limit:
            raise AdapterError(f"max_loaded_loras ({limit}) adapters are loaded: unload one first")
        if ref.pinned and len(self.pool.pinned) >= self.max_loras_per_batch - 1:
            raise AdapterError(
                f"at most max_loras_per_batch - 1 ({self.max_loras_per_batch - 1}) adapters may be"
                " pinned"
            )
        adapter = load_adapter(ref, self.dtype)
        self._add(adapter)
        return adapter

    def _add(self, adapter: LoRAAdapter) -> None:
        self.pool.check(adapter)
        self.adapters[adapter.uid] = adapter
        if adapter.ref.pinned:
            self.pool.pin(adapter)

    def unload(self, uid: str) -> None:
        if uid not in self.adapters:
            raise AdapterError(f"no adapter {uid!r} is loaded")
        self.adapters.pop(uid)
        self.pool.release(uid)

    def serves(self, uid: str | None) -> bool:
        return uid is None or uid in self.adapters

    def adapters_info(self) -> list[dict]:
        return [
            {
                "lora_name": a.ref.lora_name,
                "lora_path": a.ref.lora_path,
                "pinned": a.ref.pinned,
                "uid": uid,
            }
            for uid, a in self.adapters.items()
        ]

    def fits(self, lora_ids: set) -> bool:
        """Whether a batch of these adapters (None: the base model) may run: at most
        max_loras_per_batch distinct ones, the base counting as one, and slots for them beside the
        pinned.
        """
        return (
            len(lora_ids) <= self.max_loras_per_batch
            and len((lora_ids - {None}) | self.pool.pinned) <= self.pool.num_slots
        )

    # ------------------------------------------------------------- compute
    def begin_forward(self, fb: ForwardBatch) -> None:
        """This batch's segments: per request, its adapter's slot (-1: the base model) and
        tokens."""
        ids = fb.lora_ids
        if not any(ids):
            self.delta.end()
            return
        slots = self.pool.acquire([self.adapters[u] for u in ids if u is not None])
        counts = fb.extend_seq_lens_cpu if fb.extend_seq_lens_cpu is not None else [1] * len(ids)
        self.delta.begin([slots[u] if u else -1 for u in ids], list(counts), fb.input_ids.device)

    def _hook(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        if not self.delta.active:
            return None
        t = self._layers[id(module)]
        x = args[0].reshape(-1, args[0].shape[-1]).to(t.A.dtype)
        self.delta.apply(x, out.view(-1, out.shape[-1]), t.A, t.B)
        return out


def create_lora_runtime(
    config: LoRAConfig | None, model: nn.Module, dtype: torch.dtype, device: torch.device
) -> BaseLoRARuntime:
    return NoLoRA() if config is None else LoRARuntime(config, model, dtype, device)
