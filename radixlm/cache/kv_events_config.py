"""KVEventsConfig: --kv-events-config, SGLang's JSON object that turns on KV-event publishing (the
radix tree's stored / removed / cleared blocks, for cache-aware routers: kv_events.py). Its fields
and defaults are SGLang's (python/sglang/srt/disaggregation/kv_events.py: KVEventsConfig);
validated here, in the launching process, so a bad value is one line naming the field before any
process starts. The publisher kinds are kv_event_publisher.py's registry."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

OPTION = "--kv-events-config"
PUBLISHERS = ("null", "zmq")  # kv_event_publisher.KV_EVENT_PUBLISHER_REGISTRY's names


@dataclass(frozen=True)
class KVEventsConfig:
    publisher: str = "null"  # "zmq" publishes; "null" records nothing
    endpoint: str = "tcp://*:5557"  # PUB socket: bound for a wildcard host or ipc, else connected
    replay_endpoint: str | None = None  # ROUTER socket answering "batches from seq N" requests
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # batches waiting for the publisher thread
    topic: str = ""  # the first frame of every message (subscribers filter on it)

    @property
    def enabled(self) -> bool:
        return self.publisher != "null"

    @classmethod
    def from_cli(cls, value: str | None) -> KVEventsConfig | None:
        """The option's JSON; None (off) when absent or its publisher is "null". A malformed value
        is a ValueError of one line naming the field."""
        if value is None or not value.strip():
            return None
        try:
            raw = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{OPTION}: not JSON ({e.msg} at char {e.pos})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{OPTION}: must be a JSON object, got {type(raw).__name__}")
        known = {f.name: f for f in fields(cls)}
        for name, v in raw.items():
            if name not in known:
                raise ValueError(f"{OPTION}: unknown field {name!r} (fields: {', '.join(known)})")
            _check_field(name, v)
        config = cls(**raw)
        return config if config.enabled else None


def _check_field(name: str, v: object) -> None:
    where = f"{OPTION}.{name}"
    if name == "publisher":
        if v not in PUBLISHERS:
            raise ValueError(f"{where}: must be one of {', '.join(PUBLISHERS)}, got {v!r}")
    elif name in ("endpoint", "replay_endpoint"):
        if v is None and name == "replay_endpoint":
            return
        if not isinstance(v, str) or "://" not in v:
            raise ValueError(f"{where}: must be a ZMQ endpoint such as tcp://*:5557, got {v!r}")
        if v.startswith("tcp://") and not v.rpartition(":")[2].isdigit():
            raise ValueError(f"{where}: a tcp endpoint needs a port, got {v!r}")
    elif name == "topic":
        if not isinstance(v, str):
            raise ValueError(f"{where}: must be a string, got {v!r}")
    elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: must be a positive integer, got {v!r}")


def kv_events_for_rank(value: str, rank: int) -> str:
    """--kv-events-config of the rank-th server of --dp N (its endpoints offset by rank)."""
    raw = json.loads(value)
    raw["endpoint"] = offset_endpoint_port(raw.get("endpoint", KVEventsConfig.endpoint), rank)
    if raw.get("replay_endpoint"):
        raw["replay_endpoint"] = offset_endpoint_port(raw["replay_endpoint"], rank)
    return json.dumps(raw)


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"  # ipc:// paths: a file of their own
