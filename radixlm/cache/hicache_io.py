"""Background I/O of the L3 tier: one writer thread (stores run behind the scheduler, never in its
step) and a small reader pool for prefetches, with reads of the same chunk shared.

Also the per-tier counters the server reports (HiCacheStats)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields

from radixlm.cache.kv_data import KVData
from radixlm.cache.storage import HiCacheStorage

logger = logging.getLogger(__name__)

# Chunks waiting for the writer; past this, new stores are dropped (counted) rather than queued
# without bound while the disk is slower than the traffic.
MAX_PENDING_WRITES = 512


@dataclass
class HiCacheStats:
    l1_evicted_tokens: int = 0  # moved down from L1 (kept in L2)
    dropped_tokens: int = 0  # left every tier
    l2_hit_tokens: int = 0  # loaded back L2 -> L1 at admission
    l2_loads: int = 0
    l2_load_seconds: float = 0.0
    l2_evicted_tokens: int = 0
    l3_hit_tokens: int = 0  # prefetched L3 -> L2
    l3_loads: int = 0  # prefetches that found something
    l3_load_seconds: float = 0.0  # request arrival -> its chunks in L2
    bytes_l1_to_l2: int = 0
    bytes_l2_to_l1: int = 0
    bytes_to_l3: int = 0
    bytes_from_l3: int = 0
    l3_chunks_written: int = 0
    corrupt_chunks: int = 0  # stored chunks that failed a check (skipped, never served)
    read_errors: int = 0
    write_errors: int = 0
    writes_dropped: int = 0
    # A hybrid model's state snapshots (hi_mamba_radix_cache.py): backed up to the host, loaded
    # back, dropped from the host for room, dropped without host room, failed their checksum.
    state_l1_to_l2: int = 0
    state_l2_loads: int = 0
    state_l2_evicted: int = 0
    state_dropped: int = 0
    state_corrupt: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, name: str, n: float = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


@dataclass
class Prefetch:
    """Chunks [first_chunk, first_chunk + len(futures)) of `token_ids` being read from L3."""

    token_ids: list[int]
    start: int  # token position of the first chunk
    futures: list[Future]
    keys: list[str]
    namespace: Hashable = None  # the prefix's (PrefixKey.namespace)
    started: float = field(default_factory=time.perf_counter)
    taken: int = 0  # leading chunks already hung into the tree
    added: int = 0  # tokens they added
    failed: bool = False  # a chunk could not be read: the ones after it are not used
    done: bool = (
        False  # every read ended and its results are in the tree (HiRadixCache.poll_prefetches)
    )


class HiCacheIO:
    def __init__(self, storage: HiCacheStorage, stats: HiCacheStats, read_threads: int = 2):
        self.storage = storage
        self.stats = stats
        self.readers = ThreadPoolExecutor(read_threads, thread_name_prefix="radixlm-hicache-read")
        self.inflight: dict[str, Future] = {}  # chunk key -> its read (scheduler thread only)
        self.writes: queue.Queue = queue.Queue()
        self.pending_keys: set[str] = set()  # queued or being written (scheduler thread adds)
        self._lock = threading.Lock()
        self._logged: set[str] = set()  # failure kinds logged once already
        self.writer = threading.Thread(
            target=self._write_loop, name="radixlm-hicache-write", daemon=True
        )
        self.writer.start()

    # --- reads ------------------------------------------------------------------
    def read(self, key: str, token_ids: list[int]) -> Future:
        f = self.inflight.get(key)
        if f is None:
            f = self.inflight[key] = self.readers.submit(self._read, key, token_ids)
        return f

    def _read(self, key: str, token_ids: list[int]) -> KVData | None:
        """The chunk, or None: whatever goes wrong in the backend is a cache miss, and what reaches
        the tree has the pool's layout (a wrong one would fail in the scheduler's step)."""
        try:
            data = self.storage.get(key, token_ids)
        except Exception:
            self._failed("read_errors", "reading a KV chunk failed")
            return None
        if data is not None and not self.storage.layout.fits(data):
            self._failed("corrupt_chunks", "a stored KV chunk of another layout", exc_info=False)
            return None
        if data is not None:
            self.stats.count("bytes_from_l3", data.nbytes)
        return data

    def _failed(self, counter: str, message: str, exc_info: bool = True) -> None:
        self.stats.count(counter)
        if counter not in self._logged:
            self._logged.add(counter)
            logger.warning(
                "hicache: %s (further ones are counted in %s)", message, counter, exc_info=exc_info
            )

    def forget(self, keys: list[str]) -> None:
        for k in keys:
            f = self.inflight.get(k)
            if f is not None and f.done():
                del self.inflight[k]

    # --- writes -----------------------------------------------------------------
    def is_pending(self, key: str) -> bool:
        with self._lock:
            return key in self.pending_keys

    def write(self, key: str, token_ids: list[int], data: KVData) -> bool:
        with self._lock:
            if key in self.pending_keys:
                return True
            if len(self.pending_keys) >= MAX_PENDING_WRITES:
                self.stats.count("writes_dropped")
                return False
            self.pending_keys.add(key)
        self.writes.put((key, token_ids, data))
        return True

    def _write_loop(self) -> None:
        while True:
            item = self.writes.get()
            if item is None:
                return
            key, token_ids, data = item
            try:
                if self.storage.set(key, token_ids, data):
                    self.stats.count("bytes_to_l3", data.nbytes)
                    self.stats.count("l3_chunks_written")
            except Exception:
                self._failed("write_errors", "storing a KV chunk failed")
            finally:
                with self._lock:
                    self.pending_keys.discard(key)
                self.writes.task_done()

    def wait_writes(self, timeout: float | None = None) -> bool:
        """Block until every queued store is done (tests, shutdown, flush); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.writes.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        self.writes.put(None)
        self.readers.shutdown(wait=False, cancel_futures=True)
