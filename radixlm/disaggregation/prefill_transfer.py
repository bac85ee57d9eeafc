"""PrefillTransfer: the prefill server's side of KV transfers, run on threads beside the scheduler.

- the bootstrap service (rank 0), where this rank registers its control endpoint and KV layout;
- the control thread: a ZMQ PULL socket receiving each room's TransferDest (where the decode
  server reserved slots) and TransferAck (the decode side has it, or gave up);
- the sender thread: moves a room's KV with the backend, then pushes the AuxRecord.

The scheduler thread only calls dest / send / poll / forget; the threads own their sockets.
"""

from __future__ import annotations

import collections
import logging
import pickle
import queue
import threading
from dataclasses import asdict

import torch
import zmq

from radixlm.disaggregation.backends import make_backend
from radixlm.disaggregation.bootstrap import BootstrapServer, register
from radixlm.disaggregation.config import DisaggregationConfig
from radixlm.disaggregation.protocol import (
    AuxRecord,
    KVLayout,
    KVPoll,
    TransferAck,
    TransferDest,
    kv_checksum,
)

logger = logging.getLogger(__name__)
SEND_TIMEOUT_MS = 5000  # a peer that takes no data for this long has failed the transfer


class PrefillTransfer:
    def __init__(self, config: DisaggregationConfig, pool, engine_rank: int = 0):
        self.config = config
        self.pool = pool
        self.backend = make_backend(config.transfer_backend)
        self.layout = KVLayout.of(pool)
        self.ctx = zmq.Context.instance()
        self.lock = threading.Lock()
        self._dests: dict[int, TransferDest] = {}
        self._acks: dict[int, TransferAck] = {}
        self._send_errors: dict[int, str] = {}
        self._jobs: queue.Queue = queue.Queue()
        self.stats = collections.Counter()
        self.checksums: collections.OrderedDict[int, str] = (
            collections.OrderedDict()
        )  # room -> sent KV's
        control = self.ctx.socket(zmq.PULL)
        port = control.bind_to_random_port(f"tcp://{config.host}")
        self.endpoint = f"tcp://{config.host}:{port}"
        threading.Thread(
            target=self._control_loop, args=(control,), name="radixlm-pd-control", daemon=True
        ).start()
        threading.Thread(target=self._send_loop, name="radixlm-pd-sender", daemon=True).start()
        self.bootstrap = (
            BootstrapServer(config.host, config.bootstrap_port) if engine_rank == 0 else None
        )
        register(
            f"http://{config.host}:{config.bootstrap_port}",
            {
                "engine_rank": engine_rank,
                "endpoint": self.endpoint,
                "backend": self.backend.name,
                "layout": asdict(self.layout),
            },
        )
        logger.info(
            "PD prefill: bootstrap service on port %d, control endpoint %s, backend %s",
            config.bootstrap_port,
            self.endpoint,
            self.backend.name,
        )

    # --- threads ------------------------------------------------------------------------
    def _control_loop(self, sock) -> None:
        while True:
            msg = pickle.loads(sock.recv())
            with self.lock:
                if isinstance(msg, TransferDest):
                    self._dests[msg.room] = msg
                elif isinstance(msg, TransferAck):
                    self._acks[msg.room] = msg

    def _send_loop(self) -> None:
        socks: dict[str, zmq.Socket] = {}
        while True:
            room, dest, src_slots, aux = self._jobs.get()
            try:
                sock = socks.get(dest.decode_endpoint)
                if sock is None:
                    sock = socks[dest.decode_endpoint] = self.ctx.socket(zmq.PUSH)
                    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
                    sock.setsockopt(
                        zmq.IMMEDIATE, 1
                    )  # no queueing towards a peer that is not there
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(dest.decode_endpoint)
                if self.config.debug_checksum and not aux.error:
                    aux.checksum = kv_checksum(self.pool, src_slots)
                    with self.lock:
                        self.checksums[room] = aux.checksum
                        while len(self.checksums) > 256:
                            self.checksums.popitem(last=False)
                moved = (
                    0
                    if aux.error
                    else self.backend.write(dest, self.pool, src_slots, sock.send_multipart)
                )
                sock.send(pickle.dumps(aux))
                with self.lock:
                    self.stats["bytes_sent"] += moved
                    self.stats["tokens_sent"] += int(src_slots.numel())
            except Exception as e:
                logger.warning(
                    "PD transfer of room %d to %s failed: %s", room, dest.decode_endpoint, e
                )
                with self.lock:
                    self._send_errors[room] = f"{type(e).__name__}: {e}"

    # --- the scheduler thread's calls -----------------------------------------------------
    def dest(self, room: int) -> TransferDest | None:
        with self.lock:
            return self._dests.get(room)

    def check_dest(self, dest: TransferDest, prompt_len: int) -> str | None:
        """Why this destination cannot take the room's KV, or None."""
        if dest.layout != self.layout:
            return (
                f"the decode server's KV layout {dest.layout} differs from this server's"
                f" {self.layout}"
            )
        if (
            not 0 <= dest.prefix_len < prompt_len
            or len(dest.dst_slots) != prompt_len - dest.prefix_len
        ):
            return (
                f"the decode server reserved {len(dest.dst_slots)} slots after a prefix of"
                f" {dest.prefix_len} for a prompt of {prompt_len} tokens"
            )
        return None

    def send(self, dest: TransferDest, src_slots: torch.Tensor, aux: AuxRecord) -> None:
        self._jobs.put((dest.room, dest, src_slots.clone(), aux))

    def fail(self, dest: TransferDest, aux: AuxRecord) -> None:
        """Tell the decode side this room failed here (it frees its slots at once)."""
        self._jobs.put((dest.room, dest, torch.empty(0, dtype=torch.int64), aux))

    def poll(self, room: int) -> KVPoll:
        with self.lock:
            if room in self._send_errors:
                return KVPoll.FAILED
            ack = self._acks.get(room)
        if ack is None:
            return KVPoll.TRANSFERRING
        return KVPoll.SUCCESS if ack.ok else KVPoll.FAILED

    def failure(self, room: int) -> str:
        with self.lock:
            ack = self._acks.get(room)
            return self._send_errors.get(room) or (ack.reason if ack else "no acknowledgement")

    def forget(self, room: int, ok: bool) -> None:
        with self.lock:
            self._dests.pop(room, None)
            self._acks.pop(room, None)
            self._send_errors.pop(room, None)
            self.stats["transfers_ok" if ok else "transfers_failed"] += 1

    def info(self) -> dict:
        with self.lock:
            return {
                "mode": "prefill",
                "backend": self.backend.name,
                "bootstrap_port": self.config.bootstrap_port,
                **{
                    k: self.stats[k]
                    for k in ("transfers_ok", "transfers_failed", "bytes_sent", "tokens_sent")
                },
                "checksums": {str(r): c for r, c in self.checksums.items()},
            }
