"""DecodeTransfer: the decode server's side of KV transfers, run on threads beside the scheduler.

- the receiver thread: a ZMQ PULL data socket; a KV frame is written into the slots reserved for
  its room at once (under the lock, so a room the scheduler has cancelled takes no late write);
  an AuxRecord marks the room arrived;
- the control thread: looks prefill servers up at their bootstrap service (once per host:port)
  and sends each room's TransferDest and TransferAck to the prefill rank's control endpoint.

The scheduler thread calls route / start / arrived / cancel / ack.
"""

from __future__ import annotations

import collections
import logging
import pickle
import queue
import threading
import time

import torch
import zmq

from radixlm.disaggregation.backends import make_backend
from radixlm.disaggregation.bootstrap import query_route
from radixlm.disaggregation.config import DisaggregationConfig
from radixlm.disaggregation.protocol import (
    AuxRecord,
    KVLayerChunk,
    KVLayout,
    TransferAck,
    TransferDest,
    kv_checksum,
)
from radixlm.ipc import BootstrapInfo

logger = logging.getLogger(__name__)
ROUTE_RETRY_S = 0.2  # a bootstrap service not up yet is asked again after this long


class DecodeTransfer:
    def __init__(self, config: DisaggregationConfig, pool):
        self.config = config
        self.pool = pool
        self.backend = make_backend(config.transfer_backend)
        # Before any KV is written: the pool may move (shm) or be registered (mooncake).
        self.remote_pool = self.backend.prepare_pool(pool)
        self.layout = KVLayout.of(pool)
        self.ctx = zmq.Context.instance()
        self.lock = threading.Lock()
        self._rooms: dict[
            int, torch.Tensor
        ] = {}  # room -> its reserved slots (KV frames land there)
        self._arrived: dict[int, AuxRecord] = {}
        self._routes: dict[tuple[str, int], dict] = {}
        self._route_errors: dict[tuple[str, int], str] = {}
        self._asked: dict[tuple[str, int], float] = {}
        self._out: queue.Queue = queue.Queue()
        self.stats = collections.Counter()
        self.checksums: collections.OrderedDict[int, str] = collections.OrderedDict()
        data = self.ctx.socket(zmq.PULL)
        port = data.bind_to_random_port(f"tcp://{config.host}")
        self.endpoint = f"tcp://{config.host}:{port}"
        threading.Thread(
            target=self._recv_loop, args=(data,), name="radixlm-pd-receiver", daemon=True
        ).start()
        threading.Thread(target=self._control_loop, name="radixlm-pd-control", daemon=True).start()
        logger.info("PD decode: data endpoint %s, backend %s", self.endpoint, self.backend.name)

    # --- threads ------------------------------------------------------------------------
    def _recv_loop(self, sock) -> None:
        while True:
            frames = sock.recv_multipart(copy=False)
            try:
                msg = pickle.loads(frames[0].buffer)
                if isinstance(msg, KVLayerChunk):
                    with self.lock:
                        dst = self._rooms.get(msg.room)
                        if dst is not None:  # else cancelled (timed out, aborted): dropped
                            self.stats["bytes_received"] += self.backend.on_chunk(
                                msg, [f.buffer for f in frames[1:]], self.pool, dst
                            )
                elif isinstance(msg, AuxRecord):
                    with self.lock:
                        if msg.room in self._rooms:
                            self._arrived[msg.room] = msg
            except Exception:
                logger.exception("PD: a bad frame from a prefill server")

    def _control_loop(self) -> None:
        socks: dict[str, zmq.Socket] = {}
        while True:
            op, *args = self._out.get()
            try:
                if op == "route":
                    key = args[0]
                    route = query_route(*key, timeout=5.0)
                    with self.lock:
                        if route is not None:
                            self._routes[key] = route
                        else:
                            self._route_errors[key] = "the prefill rank has not registered yet"
                    continue
                endpoint, msg = args
                sock = socks.get(endpoint)
                if sock is None:
                    sock = socks[endpoint] = self.ctx.socket(zmq.PUSH)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.SNDTIMEO, 5000)
                    sock.connect(endpoint)
                sock.send(pickle.dumps(msg))
            except Exception as e:
                if op == "route":
                    with self.lock:
                        self._route_errors[args[0]] = f"{type(e).__name__}: {e}"
                else:
                    logger.warning(
                        "PD: sending %s to %s failed: %s", type(args[1]).__name__, args[0], e
                    )

    # --- the scheduler thread's calls -----------------------------------------------------
    def route(self, info: BootstrapInfo) -> dict | None:
        """The prefill rank's registration, or None while it is being looked up (asked again every
        ROUTE_RETRY_S while the service cannot be reached)."""
        key = (info.host, info.port)
        with self.lock:
            route = self._routes.get(key)
        if route is None and time.monotonic() - self._asked.get(key, -1e9) > ROUTE_RETRY_S:
            self._asked[key] = time.monotonic()
            self._out.put(("route", key))
        return route

    def route_error(self, info: BootstrapInfo) -> str:
        with self.lock:
            return self._route_errors.get((info.host, info.port), "no answer yet")

    def check_route(self, route: dict) -> str | None:
        if route.get("backend") != self.backend.name:
            return (
                f"the prefill server uses --disaggregation-transfer-backend {route.get('backend')},"
                f" this decode server {self.backend.name}"
            )
        if KVLayout(**route["layout"]) != self.layout:
            return (
                f"the prefill server's KV layout {route['layout']} differs from this server's"
                f" {self.layout}"
            )
        return None

    def start(self, room: int, route: dict, dst_slots: torch.Tensor, prefix_len: int) -> None:
        with self.lock:
            self._rooms[room] = dst_slots
        dest = TransferDest(
            room, self.endpoint, "", dst_slots.tolist(), prefix_len, self.layout, self.remote_pool
        )
        self._out.put(("send", route["endpoint"], dest))

    def arrived(self, room: int) -> AuxRecord | None:
        with self.lock:
            return self._arrived.get(room)

    def finish(self, room: int, route: dict | None, ok: bool, reason: str = "") -> str | None:
        """The room is done here: no more writes to its slots; the prefill side hears of it. With
        --disaggregation-debug-checksum, returns the received KV's SHA-256 (before the slots
        change).
        """
        checksum = None
        with self.lock:
            slots = self._rooms.pop(room, None)
            aux = self._arrived.pop(room, None)
            if ok and slots is not None and aux is not None:
                self.stats["tokens_received"] += int(slots.numel())
                if self.config.debug_checksum:
                    checksum = self.checksums[room] = kv_checksum(self.pool, slots)
                    while len(self.checksums) > 256:
                        self.checksums.popitem(last=False)
            self.stats["transfers_ok" if ok else "transfers_failed"] += 1
        if route is not None:
            self._out.put(("send", route["endpoint"], TransferAck(room, ok, reason)))
        return checksum

    def info(self) -> dict:
        with self.lock:
            return {
                "mode": "decode",
                "backend": self.backend.name,
                "shm_pool": getattr(self.remote_pool, "path", None),
                "rooms_in_flight": len(self._rooms),
                **{
                    k: self.stats[k]
                    for k in (
                        "transfers_ok",
                        "transfers_failed",
                        "bytes_received",
                        "tokens_received",
                    )
                },
                "checksums": {str(r): c for r, c in self.checksums.items()},
            }
