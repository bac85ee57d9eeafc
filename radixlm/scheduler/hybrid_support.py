"""What a hybrid model (recurrent state layers beside attention: docs/hybrid.md) is not served
with yet, refused at start-up in one line each (never a server that would answer wrongly)."""

from __future__ import annotations

from radixlm.disaggregation.config import DisaggregationMode
from radixlm.distributed.parallel_state import get_tp_group
from radixlm.scheduler.config import SchedulerConfig


def hybrid_refusal(config: SchedulerConfig, architecture: str) -> str | None:
    """None, or why this server cannot run the hybrid `architecture` with these options."""
    why = None
    spec = config.speculative
    if spec is not None and spec.is_eagle and not spec.is_mtp:
        why = (
            "EAGLE heads: not verified on recurrent state yet (nextn, ngram, radix, draft-model do)"
        )
    elif config.disaggregation.mode != DisaggregationMode.NULL:
        why = "PD disaggregation: the recurrent state does not travel with the KV yet"
    elif config.runner.lora is not None:
        why = "--enable-lora: no adapter targets the recurrent layers yet"
    elif get_tp_group().world_size > 1:
        why = "tensor parallelism: the recurrent layers' heads are not split across ranks yet"
    return None if why is None else f"{architecture} (a hybrid model) is not served with {why}"


def check_hybrid_support(config: SchedulerConfig, architecture: str, hybrid: bool) -> None:
    why = hybrid_refusal(config, architecture) if hybrid else None
    if why:
        raise ValueError(why)
