"""The L3 chunk file format: what is on disk, and the checks a file passes before it is served.

    MAGIC | header length (u32) | header (JSON: dtype, shape, scales, owner) | k | v | [k_scale |
    v_scale] | MAC

The MAC is an HMAC-SHA256 under the storage secret (storage_dir.py) over the model key, the chunk
key and the chunk's token ids, then everything before it. The token ids and the model key are not
stored: a file proves it holds the KV of those tokens under this model without naming them, and a
file forged or copied by anyone without the secret fails. The header is parsed only after the MAC
passed, and its dtype and shape must be exactly the pool's layout (ChunkLayout): a file that
decodes is one the scheduler can copy into L2 as it is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass

import torch

from radixlm.cache.kv_data import KVData
from radixlm.cache.memory_pool import scaled_kv, stored_dim

MAGIC = b"RLMKV002"
MAC_LEN = 32
MAX_HEADER = 1024  # bytes; ours is ~100
_PREFIX = len(MAGIC) + 4


class StorageError(Exception):
    """A stored chunk that must not be served (truncated, forged, another model's, another
    layout)."""


@dataclass(frozen=True)
class ChunkLayout:
    """The shape every stored chunk of a server has: its pool's geometry, the stored element type
    (int8 and int4 come with float32 scales) and the chunk size in tokens."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    tokens: int
    v_head_dim: int | None = None  # None: head_dim (0: an MLA latent pool, no V)

    @property
    def scales(self) -> bool:
        return scaled_kv(self.dtype)

    def tensors(self) -> list[tuple[list[int], torch.dtype]]:
        rows = [self.num_layers, self.tokens, self.num_kv_heads]
        kv = rows + [stored_dim(self.head_dim, self.dtype)]
        v_dim = self.head_dim if self.v_head_dim is None else self.v_head_dim
        v = kv[:3] + [stored_dim(v_dim, self.dtype)]
        out = [(kv, self.dtype), (v, self.dtype)]
        return out + [(kv[:3], torch.float32)] * 2 if self.scales else out

    @property
    def payload_bytes(self) -> int:
        return sum(_numel(s) * torch.tensor([], dtype=d).element_size() for s, d in self.tensors())

    @property
    def max_file_bytes(self) -> int:
        """No valid file is larger: a bound checked before reading one."""
        return _PREFIX + MAX_HEADER + self.payload_bytes + MAC_LEN

    def fits(self, data: KVData) -> bool:
        got = data.tensors()
        return len(got) == len(self.tensors()) and all(
            list(t.shape) == s and t.dtype == d for t, (s, d) in zip(got, self.tensors())
        )


def _numel(shape: list[int]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _mac(secret: bytes, model_key: str, key: str, token_ids: list[int]):
    h = hmac.new(secret, digestmod=hashlib.sha256)
    h.update(b"radixlm-kv-chunk\0%s\0%s\0" % (model_key.encode(), key.encode()))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h


def encode_chunk(
    secret: bytes, model_key: str, key: str, token_ids: list[int], data: KVData, owner: str = ""
) -> bytes:
    dtype = str(data.k.dtype).replace("torch.", "")
    header = json.dumps(
        {
            "dtype": dtype,
            "shape": list(data.k.shape),
            "scales": data.k_scale is not None,
            "owner": owner,
        }
    ).encode()
    parts = [MAGIC, struct.pack("<I", len(header)), header]
    for t in data.tensors():
        parts.append(t.contiguous().view(torch.uint8).numpy().tobytes())
    body = b"".join(parts)
    h = _mac(secret, model_key, key, token_ids)
    h.update(body)
    return body + h.digest()


def read_owner(prefix: bytes) -> str | None:
    """The owner named in a file's first bytes (unauthenticated: for /flush_cache's choice of what
    is its own), or None when they are not a chunk header of this format."""
    if len(prefix) < _PREFIX or prefix[: len(MAGIC)] != MAGIC:
        return None
    (hlen,) = struct.unpack("<I", prefix[len(MAGIC) : _PREFIX])
    try:
        header = json.loads(prefix[_PREFIX : _PREFIX + hlen])
    except ValueError:
        return None
    owner = header.get("owner") if isinstance(header, dict) else None
    return owner if isinstance(owner, str) else None


def decode_chunk(
    blob, secret: bytes, model_key: str, key: str, token_ids: list[int], layout: ChunkLayout
) -> KVData:
    """The chunk in blob (a writable buffer; its tensors share blob's memory), or StorageError
    naming what is wrong."""
    mv = memoryview(blob).cast("B")
    if len(mv) < _PREFIX + MAC_LEN or bytes(mv[: len(MAGIC)]) != MAGIC:
        raise StorageError("not a radixlm KV chunk of this format (bad magic or too short)")
    (hlen,) = struct.unpack("<I", mv[len(MAGIC) : _PREFIX])
    start, end = _PREFIX + hlen, len(mv) - MAC_LEN
    if hlen > MAX_HEADER or start > end:
        raise StorageError("bad header length")
    h = _mac(secret, model_key, key, token_ids)
    h.update(mv[:end])
    if not hmac.compare_digest(h.digest(), bytes(mv[end:])):
        raise StorageError(
            "MAC mismatch (damaged, forged, or stored for other tokens, another model or "
            "another storage key)"
        )
    try:
        header = json.loads(bytes(mv[_PREFIX:start]))
    except ValueError as e:
        raise StorageError(f"unreadable header: {e}") from None
    want = {
        "dtype": str(layout.dtype).replace("torch.", ""),
        "shape": layout.tensors()[0][0],
        "scales": layout.scales,
    }
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in want.items()):
        got = {k: header.get(k) for k in want} if isinstance(header, dict) else header
        raise StorageError(f"layout {got} is not this server's {want}")
    if end - start != layout.payload_bytes:
        raise StorageError(f"payload of {end - start} bytes, expected {layout.payload_bytes}")
    tensors, off = [], start
    for shape, dt in layout.tensors():
        count = _numel(shape)
        if count == 0:  # an MLA latent pool's V (frombuffer refuses an empty count)
            tensors.append(torch.empty(shape, dtype=dt))
            continue
        tensors.append(torch.frombuffer(mv, dtype=dt, count=count, offset=off).view(shape))
        off += count * tensors[-1].element_size()
    return KVData(*tensors)
