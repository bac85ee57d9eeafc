"""The wire schema of KV events: SGLang's (0.5.10, python/sglang/srt/disaggregation/kv_events.py),
field for field and in its order, so that a subscriber written against SGLang's classes (SGLang's
router, Dynamo, llm-d) decodes radixlm's messages. msgspec structs encoded as msgpack arrays
(array_like); an event is tagged with its class name (tag=True: ["BlockStored", ...]); trailing
fields equal to their defaults are left out (omit_defaults), as SGLang's are.

A leaf: the scheduler's publisher (cache/kv_event_publisher.py) encodes with it and the router's
subscriber (router/kv_events.py) decodes with it. Imported only where events are published or
subscribed to (msgspec is needed then and only then)."""

from __future__ import annotations

from typing import Any, Optional, Union

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None  # noqa: UP045 - SGLang's annotation, kept as written


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """An event of the tree (tagged union member)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]  # noqa: UP045
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]  # noqa: UP045
    medium: Optional[str] = None  # noqa: UP045


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str] = None  # noqa: UP045


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007
