"""What the two sides of a KV transfer say to each other, and the state each side's transfer is in.

    decode -> bootstrap service   GET /route: the prefill rank's control endpoint and KV layout
    decode -> prefill (control)   TransferDest: room R's KV goes to these slots of my pool (after my
                                  cached prefix of prefix_len tokens), through this endpoint / shm pool
    prefill -> decode (data)      KVLayerChunk per layer (tcp), then AuxRecord: the first output
                                  token, its logprobs, the prompt logprobs, cached tokens, checksum
    decode -> prefill (control)   TransferAck: room R arrived (or failed): the prefill frees its KV

Both sides walk KVPoll (SGLang's names): BOOTSTRAPPING (the peer not known yet) -> WAITING_FOR_INPUT
(the prefill has the decode's slots but its prompt is still running; the decode has sent them)
-> TRANSFERRING -> SUCCESS | FAILED.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum

import torch


class KVPoll(Enum):
    BOOTSTRAPPING = "bootstrapping"
    WAITING_FOR_INPUT = "waiting-for-input"
    TRANSFERRING = "transferring"
    SUCCESS = "success"
    FAILED = "failed"


@dataclass(frozen=True)
class KVLayout:
    """The pool shape both sides must share for KV to move slot by slot."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # torch dtype name, e.g. "float32"

    @classmethod
    def of(cls, pool) -> KVLayout:
        return cls(
            pool.num_layers,
            pool.num_kv_heads,
            pool.head_dim,
            str(pool.dtype).removeprefix("torch."),
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class ShmPool:
    """A decode server's KV pool in shared memory (the shm backend): a file under /dev/shm holding
    every layer's K then V, each [kv_heads, slots, head_dim] (the CPU pool's head-major layout)."""

    path: str
    slots: int  # pool size + 1 (slot 0 is the dummy)


@dataclass(frozen=True)
class MooncakePool:
    """A decode server's KV pool registered with Mooncake's transfer engine (the mooncake backend):
    the engine session to write to and, per layer, where K and V start in that server's memory and
    the byte strides of a slot and of a KV head in them (a row of head_dim values is contiguous)."""

    session: str  # "host:rpc_port" of the decode rank's transfer engine
    k_addrs: list[int]
    v_addrs: list[int]
    slot_stride: int
    head_stride: int


@dataclass(frozen=True)
class TransferDest:
    room: int
    decode_endpoint: str  # the decode rank's data socket (ZMQ PULL)
    control_reply: str  # unused by tcp/shm; a backend's own return address (e.g. a NIXL agent)
    dst_slots: list[int]  # the decode pool's slots for prompt positions prefix_len ..
    prefix_len: int  # prompt tokens the decode server already holds (its radix cache)
    layout: KVLayout
    remote_pool: ShmPool | MooncakePool | None = None  # where a backend writes without a socket


@dataclass(frozen=True)
class KVLayerChunk:
    room: int
    layer: int
    start: int  # offset into the room's dst_slots
    count: int


@dataclass
class AuxRecord:
    """What the prefill computed besides the KV: everything the decode side needs to go on as if it
    had run the prompt itself."""

    room: int
    first_token: int
    output_token_logprobs: list = field(default_factory=list)  # [[logprob, id]] of the first token
    output_top_logprobs: list = field(default_factory=list)
    input_token_logprobs: list = field(default_factory=list)  # the prompt logprobs asked for
    input_top_logprobs: list = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens the prefill server took from its own cache
    num_tokens: int = 0  # KV positions sent
    checksum: str | None = None  # --disaggregation-debug-checksum: SHA-256 of the KV sent
    error: str | None = None  # the prefill failed this room: the decode side fails it too


@dataclass(frozen=True)
class TransferAck:
    room: int
    ok: bool
    reason: str = ""


def kv_checksum(pool, slots: torch.Tensor) -> str:
    """SHA-256 over every layer's K then V at these slots, in slot order (both sides compute it
    the same way over their own pool)."""
    h = hashlib.sha256()
    for layer in range(pool.num_layers):
        k, v = pool.get_kv_buffer(layer)
        for t in (k, v):
            h.update(t.index_select(0, slots).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
