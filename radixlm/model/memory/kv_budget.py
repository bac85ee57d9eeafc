"""The KV pool's budget in bytes from SGLang's --mem-fraction-static (stage_kv_capacity).

SGLang sizes its pool as `memory available after the weights load - (1 - F) x memory available
before` (model_runner_kv_cache_mixin.profile_max_num_token), and on a CPU it reads "available" as
the host's available RAM split among NUMA nodes. radixlm does the same with the RAM psutil reports
available, split among this host's tp ranks (each rank holds its share of the pool); on CUDA the
device's free memory. The (1 - F) x before left over is for activations, the decode mirror and
everything else. The pool's pages are committed as they are first written (memory_pool.py)."""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def fraction_kv_budget(fraction: float, before: int, after: int, share: int = 1) -> int:
    """Bytes for this rank's KV pool; a ValueError naming the option when nothing is left."""
    budget = (after - before * (1 - fraction)) / max(1, share)
    gib = 2**30
    if budget <= 0:
        raise ValueError(
            f"mem_fraction_static {fraction}: no memory left for the KV pool ({before / gib:.2f}"
            f" GiB available before the weights loaded, {after / gib:.2f} GiB after; the pool gets"
            f" after - (1 - {fraction}) x before): raise it, or give --max-total-tokens instead"
        )
    logger.info(
        "mem_fraction_static %s: %.2f GiB available before the weights, %.2f GiB after: %.2f GiB"
        " for the KV pool%s",
        fraction,
        before / gib,
        after / gib,
        budget / gib,
        f" (1/{share} of it on this rank)" if share > 1 else "",
    )
    return int(budget)


def stage_kv_capacity(
    config: Any, per_token: int, state_memory: Any, memory_before: int, device: torch.device
) -> int:
    """KV tokens this rank's pool holds (before the pipeline stages agree on the smallest).
    config: the ModelRunnerConfig; state_memory: a hybrid's StateMemory (None: attention only),
    which takes its share of the budget."""
    # (a hybrid's stage without attention layers keeps no KV: the other stages decide)
    per_token = per_token or 1
    kv_share = (lambda b: b) if state_memory is None else state_memory.kv_share
    if config.mem_fraction_static:  # SGLang's sizing; --max-total-tokens caps it, as in SGLang
        budget = fraction_kv_budget(
            config.mem_fraction_static,
            memory_before,
            available_memory_bytes(device),
            config.memory_share,
        )
        budget = kv_share(budget)
        tokens = min(budget // per_token, config.max_total_tokens or budget)
        if tokens < 1:
            raise ValueError(
                f"mem_fraction_static {config.mem_fraction_static}: {budget} bytes hold no"
                f" token's KV ({per_token} bytes)"
            )
        return tokens
    if config.max_total_tokens:
        return config.max_total_tokens
    return max(256, int(kv_share(int(config.kv_memory_gb * 2**30)) // per_token))
