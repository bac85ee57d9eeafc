"""The router's KV-event subscriber (`radixlm router --kv-events`): one SUB socket per worker that
publishes (SGLang's --kv-events-config: [topic, seq, KVEventBatch] over ZMQ), read by one thread
into the KvEventIndex (kv_index.py) the cache_aware policy matches requests against.

Where a worker publishes is asked of the worker itself: its /get_server_info carries its
`kv_events_config` (SGLang's servers report it there too). A wildcard bind (tcp://*:5557,
0.0.0.0, [::]) is reached at the worker URL's host; ipc:// paths only on the same host. A worker
without a publisher (no --kv-events-config, or publisher "null") gets no socket, and the policy
routes it on its text tree as without --kv-events.

A batch whose seq skips ahead is a gap: with the worker's `replay_endpoint` the missing batches
are asked for (SGLang's replay protocol: a start seq, answered [seq, payload] each, then
[-1, b""]) and applied in order; without one, or when the replay no longer holds them, the
worker's view is incomplete until its next AllBlocksCleared.
"""

from __future__ import annotations

import json
import logging
import threading
from urllib.parse import urlsplit

from radixlm.router.kv_index import KvEventIndex

logger = logging.getLogger(__name__)

REPLAY_TIMEOUT_MS = 2000
_END_SEQ = -1


def subscriber_endpoints(worker_url: str, server_info: dict) -> tuple[str, str, str | None] | None:
    """(endpoint, topic, replay endpoint) to subscribe to for a worker, from its
    /get_server_info; None when it publishes nothing."""
    raw = server_info.get("kv_events_config") if isinstance(server_info, dict) else None
    if not raw:
        return None
    try:
        config = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(config, dict) or config.get("publisher", "null") == "null":
        return None
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    endpoint = reachable(config.get("endpoint", "tcp://*:5557"), host)
    replay = config.get("replay_endpoint")
    return endpoint, str(config.get("topic", "")), reachable(replay, host) if replay else None


def reachable(endpoint: str, host: str) -> str:
    """A bound endpoint as another process connects to it: a wildcard host made the worker's."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    base, _, port = endpoint[len("tcp://") :].rpartition(":")
    if base in ("*", "0.0.0.0", "[::]", "::", ""):
        base = f"[{host}]" if ":" in host else host
    return f"tcp://{base}:{port}"


class KvEventSubscriber:
    """Sockets per worker and the thread that reads them. subscribe / unsubscribe are called from
    the router's event loop; the sockets are touched by the thread only (ZMQ sockets are not
    thread-safe), so changes wait in a list it picks up."""

    POLL_MS = 100

    def __init__(self, index: KvEventIndex):
        import msgspec
        import zmq

        from radixlm import kv_event_schema

        self.index = index
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._decode = msgspec.msgpack.Decoder(type=kv_event_schema.KVEventBatch).decode
        self.endpoints: dict[str, tuple[str, str, str | None]] = {}  # worker -> what it uses
        self._pending: list[tuple[str, tuple[str, str, str | None] | None]] = []
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._run, name="router-kv-events", daemon=True)
        self._thread.start()

    def subscribe(self, worker: str, endpoints: tuple[str, str, str | None]) -> None:
        with self._lock:
            self.endpoints[worker] = endpoints
            self._pending.append((worker, endpoints))
        self.index.view(worker)

    def unsubscribe(self, worker: str) -> None:
        with self._lock:
            if self.endpoints.pop(worker, None) is not None:
                self._pending.append((worker, None))
        self.index.drop(worker)

    def shutdown(self) -> None:
        self._running = False
        self._thread.join(timeout=2.0)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        zmq = self._zmq
        sockets: dict[str, object] = {}
        poller = zmq.Poller()
        try:
            while self._running:
                with self._lock:
                    pending, self._pending = self._pending, []
                for worker, endpoints in pending:
                    old = sockets.pop(worker, None)
                    if old is not None:
                        poller.unregister(old)
                        old.close(linger=0)
                    if endpoints is not None:
                        sock = self._ctx.socket(zmq.SUB)
                        sock.setsockopt_string(zmq.SUBSCRIBE, endpoints[1])
                        sock.connect(endpoints[0])
                        sockets[worker] = sock
                        poller.register(sock, zmq.POLLIN)
                        logger.info("KV events of %s: subscribed at %s", worker, endpoints[0])
                by_socket = {s: w for w, s in sockets.items()}
                for sock, _ in poller.poll(self.POLL_MS):
                    worker = by_socket[sock]
                    while sock.poll(0):
                        self._receive(worker, sock.recv_multipart())
        finally:
            for s in sockets.values():
                s.close(linger=0)
            self._ctx.term()

    def _receive(self, worker: str, frames: list[bytes]) -> None:
        if len(frames) != 3:
            logger.warning("KV events of %s: a message of %d frames ignored", worker, len(frames))
            return
        seq = int.from_bytes(frames[1], "big")
        try:
            batch = self._decode(frames[2])
        except Exception as e:  # a publisher of another schema: say so, keep the thread
            logger.warning("KV events of %s: undecodable batch %d (%s)", worker, seq, e)
            return
        self._take(worker, seq, batch)

    def _take(self, worker: str, seq: int, batch) -> None:
        position = self.index.position(worker, seq, batch.ts)
        if position == "restart":
            logger.info("KV events of %s: its publisher started again (seq %d)", worker, seq)
            self.index.restart(worker)
            position = self.index.position(worker, seq, batch.ts)
        if position == "duplicate":
            return
        if position == "gap" and not self._replay(worker, seq):
            logger.warning(
                "KV events of %s: batches before %d missed and not replayable; routing it on"
                " the text tree until its cache is cleared",
                worker,
                seq,
            )
            self.index.lost(worker, seq)
        if self.index.position(worker, seq, batch.ts) == "next":
            self.index.apply(worker, seq, batch)

    def _replay(self, worker: str, upto: int) -> bool:
        """Ask the worker's replay socket for the batches before `upto` that the view lacks;
        whether they all came."""
        with self._lock:
            endpoints = self.endpoints.get(worker)
        if endpoints is None or endpoints[2] is None:
            return False
        zmq = self._zmq
        want = self.index.view(worker).seq + 1
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.connect(endpoints[2])
            sock.send_multipart((b"", want.to_bytes(8, "big")))
            while sock.poll(REPLAY_TIMEOUT_MS):
                _, seq_bytes, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == _END_SEQ:
                    break
                if seq >= upto:
                    continue  # the live stream brings these
                if seq != self.index.view(worker).seq + 1:
                    return False  # the replay buffer no longer goes back far enough
                self.index.apply(worker, seq, self._decode(payload))
            else:
                return False
        except Exception as e:
            logger.warning("KV events of %s: replay failed (%s)", worker, e)
            return False
        finally:
            sock.close(linger=0)
        logger.info("KV events of %s: batches %d..%d replayed", worker, want, upto - 1)
        return self.index.view(worker).seq == upto - 1
