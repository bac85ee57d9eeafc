"""The memory of a hybrid model's recurrent states beside its KV pool (ModelRunner).

One budget feeds both pools. SGLang's split: the states get --mamba-full-memory-ratio (r) times
the KV pool's bytes, so a budget B gives KV B / (1 + r) and states B r / (1 + r);
--max-mamba-cache-size N instead fixes the state slots and the KV pool gets the rest of B. With
--max-total-tokens (a pool sized in tokens) the states get at least their share of
--kv-memory-gb. Each
running request holds one state slot (its ReqToTokenPool row); the other slots keep snapshots for
the prefix cache. When the slots are too few for --max-running-requests, the running requests are
capped to half of them (the other half keeps snapshots), and the log says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.cache.state_pool import MambaPool, StateSpec

logger = logging.getLogger(__name__)


def is_hybrid(model: nn.Module) -> bool:
    return model.traits().is_hybrid


@dataclass
class StateMemory:
    specs: list[list[StateSpec]]
    config: Any  # the ModelRunnerConfig (typed by use: the executor sits above memory sizing)

    @classmethod
    def of(cls, model: nn.Module, config: Any, dtype: torch.dtype):
        """The model's state layout (None: no state layers). Conv windows keep the model dtype;
        the recurrent states --mamba-ssm-dtype. config: the ModelRunnerConfig."""
        if not is_hybrid(model):
            return None
        return cls(model.state_specs(dtype, config.resolved_mamba_ssm_dtype()), config)

    @property
    def per_state(self) -> int:
        return MambaPool.bytes_per_state(self.specs)

    def kv_share(self, budget: int) -> int:
        """The KV pool's part of a budget of `budget` bytes."""
        fixed = self.config.max_mamba_cache_size
        if fixed is not None:
            left = budget - fixed * self.per_state
            if left <= 0:
                raise ValueError(
                    f"max_mamba_cache_size {fixed} states of {self.per_state} bytes take the whole"
                    f" memory budget ({budget} bytes): lower it or raise the budget"
                )
            return left
        return int(budget / (1 + self.config.mamba_full_memory_ratio))

    def slots(self, kv_bytes: int) -> int:
        cfg = self.config
        if cfg.max_mamba_cache_size is not None:
            return cfg.max_mamba_cache_size
        if not self.per_state or not kv_bytes:
            # a pipeline stage without state layers, or without attention layers (its share is
            # that of no KV): the other stages decide
            return 1 << 30
        ratio = cfg.mamba_full_memory_ratio
        share = kv_bytes * ratio
        if cfg.max_total_tokens and not cfg.mem_fraction_static:
            # The KV pool was sized in tokens, not bytes: the states still get their share of
            # --kv-memory-gb's budget (a small token pool must not starve the running requests).
            share = max(share, cfg.kv_memory_gb * 2**30 * ratio / (1 + ratio))
        return max(2, int(share // self.per_state))

    def create_pool(
        self,
        kv_bytes: int,
        max_running_requests: int,
        device: torch.device,
        agree: Callable[[int], int] = lambda n: n,
    ) -> tuple[MambaPool, int]:
        """(the pool, the running requests it allows). agree: the smallest of every pipeline
        stage's slot count (the stages' pools hold the same slots, each of its own layers).
        Under speculative decoding (config.spec_draft_tokens draft tokens per request and step)
        a verify step keeps a state per draft node, in draft slots taken from the snapshots'
        share (at most half of it: a step drafts fewer nodes where they run out)."""
        slots = agree(self.slots(kv_bytes))
        running = max_running_requests
        if slots < 2 * (running + 1):
            running = max(1, slots // 2 - 1)
            logger.warning(
                "the state pool holds %d states of %.1f MiB: running requests capped at %d (raise"
                " --mamba-full-memory-ratio, --max-mamba-cache-size or the memory budget for more)",
                slots,
                self.per_state / 2**20,
                running,
            )
        rows = running + 1
        drafts = min(self.config.spec_draft_tokens * running, (slots - rows) // 2)
        pool = MambaPool(self.specs, rows, slots - rows - drafts, device, drafts)
        logger.info(
            "state pool: %d slots x %.2f MiB (%d request rows, %d snapshots, %d draft), %.1f MiB",
            slots,
            self.per_state / 2**20,
            rows,
            slots - rows - drafts,
            drafts,
            pool.total_bytes / 2**20,
        )
        return pool, running
