"""The KV pool's budget in bytes from SGLang's --mem-fraction-static (ModelRunner._kv_capacity).

SGLang sizes its pool as `memory available after the weights load - (1 - F) x memory available
before` (model_runner_kv_cache_mixin.profile_max_num_token), and on a CPU it reads "available" as
the host's available RAM split among NUMA nodes. radixlm does the same with the RAM psutil reports
available, split among this host's tp ranks (each rank holds its share of the pool); on CUDA the
device's free memory. The (1 - F) x before left over is for activations, the decode mirror and
everything else. The pool's pages are committed as they are first written (memory_pool.py)."""

from __future__ import annotations

import logging

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
