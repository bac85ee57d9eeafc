"""L3 of the hierarchical cache: a storage backend behind get / exists / set, keyed by chunk hash.

The KV of a token sequence is stored in chunks of `chunk_size` tokens at fixed positions (chunk i
covers tokens [i*C, (i+1)*C)), like LMCache. A chunk's key chains the hashes of every token
before it and starts from the *model key* (weights, KV element type, tokenizer), so a chunk only
ever matches the same tokens at the same position under the same model.

The file backend (HiCacheFile) writes one file per chunk: a temporary name and an atomic rename
(a crash never leaves a partial file under a real name), with a header naming the model key, the
chunk key and its token ids, and a CRC32 over everything; a file that fails any check is skipped
with a warning, never served, and removed (the next store of that chunk replaces it). Size-bounded: past `max_bytes`, least recently used files go.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from abc import ABC, abstractmethod
from typing import Optional

import torch

from radixlm.cache.kv_data import KVData

logger = logging.getLogger(__name__)

MAGIC = b"RLMKV001"
SUFFIX = ".kv"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8}


def chunk_keys(model_key: str, token_ids: list[int], chunk_size: int, n_chunks: int) -> list[str]:
    """Keys of the first n_chunks full chunks of token_ids (a hash chain from the model key)."""
    keys, h = [], model_key.encode()
    for i in range(n_chunks):
        chunk = token_ids[i * chunk_size : (i + 1) * chunk_size]
        assert len(chunk) == chunk_size
        h = hashlib.sha256(h + struct.pack(f"<{chunk_size}q", *chunk)).hexdigest().encode()
        keys.append(h.decode())
    return keys


def model_key(runner, tokenizer_fingerprint: str, host_dtype: torch.dtype) -> str:
    """What KV values depend on: the architecture, the weights (a strided sample of every tensor,
    so another checkpoint of the same shape differs), the stored element type, the tokenizer."""
    h = hashlib.sha256()
    loaded = runner.loaded
    h.update(json.dumps([loaded.architecture, runner.num_layers, runner.num_kv_heads, runner.head_dim,
                         runner.vocab_size, str(host_dtype), tokenizer_fingerprint]).encode())
    for name, t in sorted(runner.model.state_dict().items()):
        t = t.detach().reshape(-1)
        step = max(1, t.numel() // 256)
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t[::step][:256].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps([vocab, tokenizer.all_special_tokens]).encode()).hexdigest()


class StorageError(Exception):
    """A stored chunk that must not be served (truncated, corrupted, another model's)."""


def encode_chunk(model_key_: str, key: str, token_ids: list[int], data: KVData) -> bytes:
    dtype = str(data.k.dtype).replace("torch.", "")
    header = json.dumps({"model_key": model_key_, "key": key, "token_ids": token_ids, "dtype": dtype,
                         "shape": list(data.k.shape), "scales": data.k_scale is not None}).encode()
    parts = [MAGIC, struct.pack("<I", len(header)), header]
    for t in data.tensors():
        parts.append(t.contiguous().view(torch.uint8).numpy().tobytes())
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_chunk(blob, model_key_: str, key: str, token_ids: list[int]) -> KVData:
    """The chunk in blob (a writable buffer; its tensors share blob's memory), or StorageError
    naming what is wrong."""
    mv = memoryview(blob).cast("B")
    if len(blob) < len(MAGIC) + 8 or bytes(mv[: len(MAGIC)]) != MAGIC:
        raise StorageError("not a radixlm KV chunk (bad magic or too short)")
    (crc,) = struct.unpack("<I", mv[-4:])
    if zlib.crc32(mv[:-4]) != crc:
        raise StorageError("checksum mismatch (truncated or corrupted)")
    end = len(blob) - 4
    (hlen,) = struct.unpack("<I", mv[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4 + hlen
    try:
        header = json.loads(bytes(mv[len(MAGIC) + 4 : start]))
    except ValueError as e:
        raise StorageError(f"unreadable header: {e}") from None
    if not isinstance(header, dict) or header.get("model_key") != model_key_:
        raise StorageError("written by another model, KV dtype or tokenizer")
    if header.get("key") != key or header.get("token_ids") != token_ids:
        raise StorageError("holds other tokens than its name says")
    dtype = _DTYPES.get(header.get("dtype"))
    shape = header.get("shape")
    if dtype is None or not isinstance(shape, list) or len(shape) != 4 or shape[1] != len(token_ids):
        raise StorageError("bad header")
    scales = bool(header.get("scales"))
    sizes = [shape, shape] + ([shape[:3], shape[:3]] if scales else [])
    dtypes = [dtype, dtype] + ([torch.float32] * 2 if scales else [])
    tensors, off = [], start
    for size, dt in zip(sizes, dtypes):
        count = int(torch.Size(size).numel())
        n = count * torch.tensor([], dtype=dt).element_size()
        if off + n > end:
            raise StorageError("payload shorter than its header says")
        tensors.append(torch.frombuffer(mv, dtype=dt, count=count, offset=off).view(size))
        off += n
    if off != end:
        raise StorageError("payload longer than its header says")
    return KVData(*tensors)


class HiCacheStorage(ABC):
    """L3 backend interface (SGLang's HiCacheStorage shape): values are whole chunks."""

    @abstractmethod
    def get(self, key: str, token_ids: list[int]) -> Optional[KVData]:
        """The chunk, or None when absent or unusable (the backend reports why)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def set(self, key: str, token_ids: list[int], data: KVData) -> bool:
        """Store a chunk; False when it could not be written (the backend reports why)."""

    def clear(self) -> None:
        """Remove every chunk."""


class HiCacheFile(HiCacheStorage):
    def __init__(self, directory: str, model_key_: str, max_bytes: int = 0, stats=None):
        self.dir = os.path.abspath(directory)
        self.model_key = model_key_
        self.max_bytes = max_bytes  # 0: unbounded
        self.stats = stats
        self.lock = threading.Lock()  # the writer thread and the prefetch threads share the index
        os.makedirs(self.dir, exist_ok=True)
        # name -> (last use, size): LRU order for the size bound; files of other servers sharing the
        # directory are found by their name (exists / get look at the file system, not this index).
        self.index: dict[str, tuple[float, int]] = {}
        now = time.time()
        for entry in os.scandir(self.dir):
            if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                st = entry.stat()
                self.index[entry.name[: -len(SUFFIX)]] = (st.st_mtime, st.st_size)
            elif entry.name.endswith(".tmp") and now - entry.stat().st_mtime > 3600:
                _unlink(entry.path)  # left behind by a crash long ago
        self.bytes = sum(size for _, size in self.index.values())

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, key + SUFFIX)

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def get(self, key: str, token_ids: list[int]) -> Optional[KVData]:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # Uninitialized memory (a bytearray would be zero-filled first: ~15% of a load).
                blob = torch.empty(size, dtype=torch.uint8).numpy()
                if f.readinto(blob) != size:
                    raise OSError("short read")
        except FileNotFoundError:
            return None
        except OSError as e:
            self._report("read_errors", f"cannot read {path}: {e}")
            return None
        try:
            data = decode_chunk(blob, self.model_key, key, token_ids)
        except StorageError as e:
            # Wrong under this name whatever it holds: remove it so the next store replaces it.
            self._report("corrupt_chunks", f"skipping stored KV chunk {path}: {e} (removed)")
            with self.lock:
                old = self.index.pop(key, None)
                self.bytes -= old[1] if old else 0
            _unlink(path)
            return None
        with self.lock:
            self.index[key] = (time.time(), len(blob))
        try:
            os.utime(path)  # LRU by modification time, also across restarts
        except OSError:
            pass
        return data

    def set(self, key: str, token_ids: list[int], data: KVData) -> bool:
        blob = encode_chunk(self.model_key, key, token_ids, data)
        tmp = os.path.join(self.dir, f".{key}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, self._path(key))
        except OSError as e:  # full disk, permissions: this chunk is not stored, nothing else changes
            _unlink(tmp)
            self._report("write_errors", f"cannot store a KV chunk in {self.dir}: {e}")
            return False
        with self.lock:
            old = self.index.get(key)
            self.bytes += len(blob) - (old[1] if old else 0)
            self.index[key] = (time.time(), len(blob))
            victims = self._over_budget()
        for victim in victims:
            _unlink(self._path(victim))
        return True

    def _over_budget(self) -> list[str]:
        if not self.max_bytes or self.bytes <= self.max_bytes:
            return []
        victims = []
        for name, (_, size) in sorted(self.index.items(), key=lambda kv: kv[1][0]):
            if self.bytes <= self.max_bytes:
                break
            victims.append(name)
            self.bytes -= size
            del self.index[name]
        return victims

    def clear(self) -> None:
        with self.lock:
            self.index, self.bytes = {}, 0
        for entry in os.scandir(self.dir):
            if entry.name.endswith(SUFFIX):
                _unlink(entry.path)

    def _report(self, counter: str, message: str) -> None:
        logger.warning("hicache: %s", message)
        if self.stats is not None:
            self.stats.count(counter)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def create_storage(backend: Optional[str], directory: str, model_key_: str, max_bytes: int,
                   stats=None) -> Optional[HiCacheStorage]:
    if backend is None:
        return None
    if backend == "file":
        return HiCacheFile(directory, model_key_, max_bytes, stats)
    raise ValueError(f"unknown hicache storage backend {backend!r} (known: file)")
