"""Picks a server's PD disaggregation mode (docs/disaggregation.md): NoDisaggregation
(pd/context.py) without one, PDPrefill (pd/prefill.py) or PDDecode (pd/decode.py); and the Finisher
that goes with it (the prefill mode's keeps a finished request's KV until it was sent)."""

from __future__ import annotations

from radixlm.disaggregation.config import DisaggregationConfig, DisaggregationMode
from radixlm.scheduler.output.finisher import Finisher
from radixlm.scheduler.pd.context import BasePDMode, NoDisaggregation, PDContext
from radixlm.scheduler.pd.decode import PDDecode
from radixlm.scheduler.pd.prefill import PDPrefill, PDPrefillFinisher


def pd_finisher_class(config: DisaggregationConfig) -> type[Finisher]:
    return PDPrefillFinisher if config.mode is DisaggregationMode.PREFILL else Finisher


def create_pd_mode(config: DisaggregationConfig, ctx: PDContext, kv_pool) -> BasePDMode:
    """kv_pool: the runner's TokenToKVPool (the transfers read and write it)."""
    if config.mode is DisaggregationMode.PREFILL:
        return PDPrefill(config, ctx, kv_pool)
    if config.mode is DisaggregationMode.DECODE:
        return PDDecode(config, ctx, kv_pool)
    return NoDisaggregation()
