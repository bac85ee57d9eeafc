"""KV-event publishers: where the tree's events (kv_events.py) go once per scheduler step, as one
KVEventBatch. A KV_EVENT_PUBLISHER_REGISTRY entry per --kv-events-config "publisher":

    null  NullEventPublisher: nothing recorded, nothing sent (the default)
    zmq   ZmqEventPublisher: SGLang's ZMQ contract. A PUB socket at `endpoint` sends each batch as
          the multipart message [topic, seq (8 bytes big-endian), msgpack payload] from a
          thread of its own; with `replay_endpoint`, a ROUTER socket answers a request frame of
          a start seq (8 bytes big-endian) with [seq, payload] for each batch still buffered
          from it, then [-1 (8 bytes, signed), b""].

A publisher's `sink` is what the tree records into (KVEventSink; set on the tree at start-up) and
`after_step` sends what was recorded.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from radixlm.cache.kv_events import NO_KV_EVENTS, KVEventRecorder, KVEventSink
from radixlm.cache.kv_events_config import KVEventsConfig
from radixlm.registry import Registry

logger = logging.getLogger(__name__)

# (the config, this server's attention-DP rank) -> the publisher
KV_EVENT_PUBLISHER_REGISTRY = Registry[Callable[[KVEventsConfig, int], "EventPublisher"], None](
    "KV event publisher"
)


class EventPublisher(ABC):
    sink: KVEventSink

    @abstractmethod
    def after_step(self) -> None:
        """Send the events the tree recorded since the last call (one batch; none if empty)."""

    @abstractmethod
    def shutdown(self) -> None: ...


@KV_EVENT_PUBLISHER_REGISTRY.register("null")
class NullEventPublisher(EventPublisher):
    def __init__(self, config: KVEventsConfig | None = None, dp_rank: int = 0):
        self.sink = NO_KV_EVENTS

    def after_step(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


@KV_EVENT_PUBLISHER_REGISTRY.register("zmq")
class ZmqEventPublisher(EventPublisher):
    END_SEQ = (-1).to_bytes(8, "big", signed=True)
    SHUTDOWN_TIMEOUT = 1.0

    def __init__(self, config: KVEventsConfig, dp_rank: int = 0):
        import msgspec
        import zmq

        from radixlm import kv_event_schema

        self.sink = KVEventRecorder()
        self.dp_rank = dp_rank
        self._batch = kv_event_schema.KVEventBatch
        self._encode = msgspec.msgpack.Encoder().encode
        self._topic = config.topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        endpoint, self._replay = config.endpoint, None
        try:
            # Bind a stable address (a wildcard host, ipc, inproc); connect to a named one.
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as e:
            self._close()
            raise ValueError(f"--kv-events-config: cannot open {endpoint}: {e}") from None
        self._seq = 0
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        logger.info("KV events: publishing on %s (topic %r)", endpoint, config.topic)

    def after_step(self) -> None:
        events = self.sink.take()
        if not events:
            return
        batch = self._batch(ts=time.time(), events=events, attn_dp_rank=self.dp_rank)
        try:
            self._queue.put_nowait(batch)
        except queue.Full:  # a subscriber that cannot keep up must not stall the scheduler
            logger.warning("KV events: queue full, a batch of %d events dropped", len(events))

    def _run(self) -> None:
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                break
            payload = self._encode(batch)
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except Exception:  # the scheduler goes on; replay still has the batch
                logger.exception("KV events: send failed")

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("KV events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", self.END_SEQ, b""))

    def shutdown(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=self.SHUTDOWN_TIMEOUT)
        self._close()

    def _close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def create_kv_event_publisher(config: KVEventsConfig | None, dp_rank: int = 0) -> EventPublisher:
    """The publisher --kv-events-config names (None: off, the null one)."""
    if config is None:
        return NullEventPublisher()
    return KV_EVENT_PUBLISHER_REGISTRY.get(config.publisher)(config, dp_rank)
