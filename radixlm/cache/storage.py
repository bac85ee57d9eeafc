"""L3 of the hierarchical cache: a storage backend behind get / exists / set, keyed by chunk hash.

The KV of a token sequence is stored in chunks of `chunk_size` tokens at fixed positions (chunk i
covers tokens [i*C, (i+1)*C)), like LMCache. A chunk's key chains the hashes of every token
before it and starts from the *model key* (weights, KV element type, tokenizer), so a chunk only
ever matches the same tokens at the same position under the same model.

The file backend (HiCacheFile) writes one file per chunk, named by an HMAC of the chunk key (the
name tells nothing about the prompt without the storage secret), under a temporary name and an
atomic rename (a crash never leaves a partial file under a real name). What is in a file and the
checks it passes before it is served: storage_codec.py; the directory, the secret, sharing it
between servers: storage_dir.py. A file that fails any check, and any error reading one, is a
cache miss: counted (`corrupt_chunks`, `read_errors`), logged once, the file removed when it is
wrong (the next store of that chunk replaces it); never an exception in the scheduler.

Servers sharing a directory: one byte count for all of them (`--hicache-storage-size-gb` bounds
the directory, least recently used files first, whoever wrote them), and each file names its
writer's owner id: `/flush_cache?level=l3` removes this server's files only. Every server with the
secret reads every file.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import struct
import time
import uuid
import weakref
from abc import ABC, abstractmethod

import torch

from radixlm.cache.hicache_config import STORAGE_BACKEND_REGISTRY
from radixlm.cache.kv_data import KVData
from radixlm.cache.storage_codec import (
    MAX_HEADER,
    ChunkLayout,
    StorageError,
    decode_chunk,
    encode_chunk,
    read_owner,
)
from radixlm.cache.storage_dir import (
    SUFFIX,
    DirUsage,
    UnsafeFileError,
    claim_owner,
    open_private_dir,
    open_regular,
    read_all,
    storage_secret,
    write_new,
)

logger = logging.getLogger(__name__)

# Evicting for room frees down to this share of the bound, so that a full directory is recounted
# once per tenth of its size written rather than at every store.
LOW_WATERMARK = 0.9
STALE_TMP_SECONDS = 3600


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
    h.update(
        json.dumps(
            [
                loaded.architecture,
                runner.num_layers,
                runner.num_kv_heads,
                runner.head_dim,
                runner.vocab_size,
                str(host_dtype),
                tokenizer_fingerprint,
            ]
        ).encode()
    )
    for name, t in sorted(runner.model.state_dict().items()):
        t = t.detach().reshape(-1)
        step = max(1, t.numel() // 256)
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t[::step][:256].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps([vocab, tokenizer.all_special_tokens]).encode()).hexdigest()


def chunk_name(secret: bytes, key: str) -> str:
    """A chunk's name in storage: an HMAC of its key (it tells nothing of the prompt)."""
    return hmac.new(secret, b"radixlm-kv-name\0" + key.encode(), hashlib.sha256).hexdigest()


def report_once(reported: set[str], stats, counter: str, message: str) -> None:
    """Count a backend's failure; log the first of each kind (planted chunks must not flood the
    log: the counters in /get_server_info and /metrics say how many)."""
    if counter not in reported:
        reported.add(counter)
        logger.warning(
            "hicache: %s (further ones are counted in %s, logged at debug level)", message, counter
        )
    else:
        logger.debug("hicache: %s", message)
    if stats is not None:
        stats.count(counter)


class HiCacheStorage(ABC):
    """L3 backend interface (SGLang's HiCacheStorage shape): values are whole chunks, each of
    `layout` (what get returns is checked against it again before it reaches the tree)."""

    layout: ChunkLayout

    @abstractmethod
    def get(self, key: str, token_ids: list[int]) -> KVData | None:
        """The chunk, or None when absent or unusable (the backend reports why)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def set(self, key: str, token_ids: list[int], data: KVData) -> bool:
        """Store a chunk; False when it could not be written (the backend reports why)."""

    @property
    def bytes(self) -> int | None:
        """The stored chunks' bytes (l3_bytes); None: a backend that does not count them."""
        return None

    def clear(self) -> None:
        """Remove every chunk (of this server, where servers share the storage)."""

    def close(self) -> None:
        pass


class HiCacheFile(HiCacheStorage):
    def __init__(
        self,
        directory: str,
        model_key_: str,
        layout: ChunkLayout,
        max_bytes: int = 0,
        stats=None,
        storage_key: str | None = None,
    ):
        self.dir = os.path.abspath(directory)
        self.model_key = model_key_
        self.layout = layout
        self.max_bytes = max_bytes  # 0: unbounded
        self.stats = stats
        self._reported: set[str] = set()
        self.dir_fd = open_private_dir(self.dir)
        fds = [self.dir_fd]
        try:
            self.secret = storage_secret(self.dir_fd, storage_key)
            self.owner, self._owner_fd = claim_owner(
                self.dir_fd, hashlib.sha256(model_key_.encode()).hexdigest()[:12]
            )
            fds.append(self._owner_fd)
            self.usage = DirUsage(self.dir_fd)
            fds.append(self.usage.fd)
            with self.usage:
                self.usage.recount()  # another server may have died mid-update
            self._remove_stale_tmp()
        except (OSError, ValueError) as e:
            for fd in fds:
                os.close(fd)
            if isinstance(e, ValueError):
                raise
            raise ValueError(f"hicache_storage_dir {self.dir}: {e.strerror or e}") from None
        # The descriptors close once nothing can use them (the I/O threads hold this object).
        weakref.finalize(self, _close_all, fds)

    def _remove_stale_tmp(self) -> None:
        now = time.time()
        with os.scandir(self.dir_fd) as it:
            for entry in it:
                if (
                    entry.name.endswith(".tmp")
                    and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_SECONDS
                ):
                    _unlink(self.dir_fd, entry.name)  # left behind by a crash long ago

    @property
    def bytes(self) -> int:
        """The directory's chunk bytes, all servers' (as last seen)."""
        return self.usage.cached

    def name(self, key: str) -> str:
        return chunk_name(self.secret, key) + SUFFIX

    def path(self, key: str) -> str:
        return os.path.join(self.dir, self.name(key))

    def exists(self, key: str) -> bool:
        """Anything under the chunk's name (get inspects it: a planted file is reported there)."""
        try:
            os.stat(self.name(key), dir_fd=self.dir_fd, follow_symlinks=False)
            return True
        except OSError:
            return False

    def get(self, key: str, token_ids: list[int]) -> KVData | None:
        name = self.name(key)
        try:
            fd, st = open_regular(self.dir_fd, name, self.layout.max_file_bytes)
        except FileNotFoundError:
            return None
        except UnsafeFileError as e:
            return self._reject(name, None, f"{e.strerror}")
        except OSError as e:
            self._report("read_errors", f"cannot read {name}: {e}")
            return None
        try:
            # Uninitialized memory (a bytearray would be zero-filled first: ~15% of a load).
            blob = torch.empty(st.st_size, dtype=torch.uint8).numpy()
            read_all(fd, blob)
        except OSError as e:
            self._report("read_errors", f"cannot read {name}: {e}")
            return None
        finally:
            os.close(fd)
        try:
            data = decode_chunk(blob, self.secret, self.model_key, key, token_ids, self.layout)
        except StorageError as e:
            return self._reject(name, st, str(e))
        try:
            os.utime(
                name, dir_fd=self.dir_fd, follow_symlinks=False
            )  # LRU by modification time, across restarts
        except OSError:
            pass
        return data

    def _reject(self, name: str, st: os.stat_result | None, why: str) -> None:
        """A file under a chunk's name that must not be served: removed (unless it was replaced
        meanwhile)."""
        self._report("corrupt_chunks", f"skipping stored KV chunk {name}: {why} (removed)")
        with self.usage:
            try:
                now = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
            except OSError:
                return None
            if st is None or (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                _unlink(self.dir_fd, name)
                if st is not None:
                    self.usage.write(self.usage.read() - st.st_size)
        return None

    def set(self, key: str, token_ids: list[int], data: KVData) -> bool:
        if not self.layout.fits(data):
            raise ValueError(f"a KV chunk of another layout than {self.layout}")
        blob = encode_chunk(self.secret, self.model_key, key, token_ids, data, self.owner)
        if self.max_bytes and len(blob) > self.max_bytes:
            self._report(
                "write_errors", f"a KV chunk of {len(blob)} bytes exceeds the storage bound"
            )
            return False
        name = self.name(key)
        tmp = f".{name[:16]}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            write_new(self.dir_fd, tmp, blob)
            with self.usage:
                try:
                    old = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_size
                except FileNotFoundError:
                    old = 0
                total = self.usage.read() + len(blob) - old
                if self.max_bytes and total > self.max_bytes:
                    total = self._evict(len(blob) - old)
                os.replace(tmp, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                self.usage.write(total)
        except (
            OSError
        ) as e:  # full disk, permissions: this chunk is not stored, nothing else changes
            _unlink(self.dir_fd, tmp)
            self._report("write_errors", f"cannot store a KV chunk in {self.dir}: {e}")
            return False
        return True

    def _evict(self, adding: int) -> int:
        """Recount the directory and remove least recently used files (any server's) until `adding`
        more bytes fit under the low watermark; the new total. Holds the usage lock."""
        files = sorted(self.usage.files())
        total = sum(size for _, size, _ in files)
        goal = int(self.max_bytes * LOW_WATERMARK)
        for _, size, name in files:
            if total + adding <= goal:
                break
            _unlink(self.dir_fd, name)
            total -= size
        return total + adding

    def clear(self) -> None:
        """Remove this server's files (those naming its owner id) and files no server can use (an
        older format's, a broken header); other servers' stay."""
        try:
            with self.usage:
                for _, _, name in self.usage.files():
                    if self._owner_of(name) in (self.owner, None):
                        _unlink(self.dir_fd, name)
                self.usage.recount()
        except OSError as e:
            self._report("write_errors", f"cannot clear {self.dir}: {e}")

    def _owner_of(self, name: str) -> str | None:
        """The owner id a file names; None when it is not a readable chunk of this format."""
        try:
            fd, _ = open_regular(self.dir_fd, name, 1 << 62)  # another model's chunks may be larger
        except OSError:
            return None
        try:
            return read_owner(os.pread(fd, 12 + MAX_HEADER, 0))
        finally:
            os.close(fd)

    def _report(self, counter: str, message: str) -> None:
        report_once(self._reported, self.stats, counter, message)

    def close(self) -> None:
        """Give up the owner id (a server started next in this process may take it)."""
        fcntl.flock(self._owner_fd, fcntl.LOCK_UN)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except IsADirectoryError:
        try:
            os.rmdir(name, dir_fd=dir_fd)  # a directory planted under a chunk's name (when empty)
        except OSError:
            pass
    except OSError:
        pass


def create_storage(
    backend: str | None,
    directory: str,
    model_key_: str,
    layout: ChunkLayout,
    max_bytes: int,
    stats=None,
    storage_key: str | None = None,
    extra_config: dict | None = None,
) -> HiCacheStorage | None:
    """The --hicache-storage-backend called `backend` (None: no L3); extra_config (SGLang's
    --hicache-storage-backend-extra-config) goes to a backend that reads one."""
    if backend is None:
        return None
    factory = STORAGE_BACKEND_REGISTRY.get(backend)
    if extra_config:
        return factory(
            directory, model_key_, layout, max_bytes, stats, storage_key, extra_config=extra_config
        )
    return factory(directory, model_key_, layout, max_bytes, stats, storage_key)
