"""L3 file backend: round trips, the hash chain, and every way a stored chunk can be wrong (each is
skipped, reported, never served); what a local attacker finds on disk (private modes, no token ids,
keyed names) and what a planted file does (nothing but a miss); two servers on one directory."""

import errno
import os
import threading

import pytest
import torch

from radixlm.cache.hicache_io import HiCacheIO, HiCacheStats
from radixlm.cache.kv_data import KVData
from radixlm.cache.storage import HiCacheFile, chunk_keys
from radixlm.cache.storage_codec import ChunkLayout, StorageError, decode_chunk, encode_chunk

C = 8
SECRET = b"s" * 32


def chunk(seed: int, dtype=torch.float16, scales=False) -> KVData:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        k, v = (
            torch.randint(-127, 128, (3, C, 2, 4), generator=g, dtype=torch.int8) for _ in range(2)
        )
    else:
        k, v = (torch.randn(3, C, 2, 4, generator=g).to(dtype) for _ in range(2))
    if scales:
        return KVData(k, v, torch.rand(3, C, 2, generator=g), torch.rand(3, C, 2, generator=g))
    return KVData(k, v)


def same(a: KVData, b: KVData) -> bool:
    return len(a.tensors()) == len(b.tensors()) and all(
        torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors())
    )


def layout(dtype=torch.float16) -> ChunkLayout:
    return ChunkLayout(3, 2, 4, dtype, C)


def store(tmp_path, key="model-a", stats=None, dtype=torch.float16, **kw) -> HiCacheFile:
    return HiCacheFile(str(tmp_path), key, layout(dtype), stats=stats or HiCacheStats(), **kw)


@pytest.mark.parametrize(
    "dtype,scales",
    [(torch.float32, False), (torch.float16, False), (torch.bfloat16, False), (torch.int8, True)],
)
def test_round_trip_every_dtype(tmp_path, dtype, scales):
    s = store(tmp_path, dtype=dtype)
    ids = list(range(C))
    data = chunk(1, dtype, scales)
    assert s.set("k1", ids, data)
    assert s.exists("k1") and not s.exists("k2")
    assert same(s.get("k1", ids), data)
    # A new process on the same directory sees it (restart).
    assert same(store(tmp_path, dtype=dtype).get("k1", ids), data)


def test_chunk_keys_chain_the_prefix_and_the_model():
    a = list(range(3 * C))
    b = a[:C] + [99] + a[C + 1 :]
    ka, kb = chunk_keys("m", a, C, 3), chunk_keys("m", b, C, 3)
    assert (
        ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]
    )  # a change poisons every later chunk
    assert chunk_keys("m", a, C, 2) == ka[:2]
    assert chunk_keys("other-model", a, C, 1)[0] != ka[0]
    # Same tokens at another position: another key.
    assert chunk_keys("m", a[C : 2 * C] * 2, C, 2)[1] != chunk_keys("m", a, C, 2)[1]


def corrupt(path, how):
    blob = bytearray(open(path, "rb").read())
    if how == "truncate":
        blob = blob[: len(blob) // 2]
    elif how == "flip":
        blob[len(blob) // 2] ^= 0x40
    elif how == "empty":
        blob = bytearray()
    elif how == "garbage":
        blob = bytearray(os.urandom(len(blob)))
    open(path, "wb").write(blob)


@pytest.mark.parametrize("how", ["truncate", "flip", "empty", "garbage"])
def test_damaged_file_is_skipped_and_reported(tmp_path, how, caplog):
    stats = HiCacheStats()
    s = store(tmp_path, stats=stats)
    ids = list(range(C))
    s.set("k1", ids, chunk(1))
    corrupt(s.path("k1"), how)
    assert s.get("k1", ids) is None
    assert stats.corrupt_chunks == 1
    assert "skipping stored KV chunk" in caplog.text
    assert not os.path.exists(s.path("k1"))  # removed: the next store replaces it


def test_file_of_another_model_or_other_tokens_is_never_served(tmp_path):
    stats = HiCacheStats()
    other = store(tmp_path, key="model-b", stats=stats)
    ids = list(range(C))
    other.set("k1", ids, chunk(1))
    mine = store(tmp_path, key="model-a", stats=stats)
    assert mine.get("k1", ids) is None  # same name, another model's KV
    other.set("k2", ids, chunk(2))
    assert other.get("k2", [t + 1 for t in ids]) is None  # the MAC covers the tokens
    assert stats.corrupt_chunks == 2
    blob = encode_chunk(SECRET, "model-b", "k", ids, chunk(3))
    with pytest.raises(StorageError, match="MAC mismatch"):
        decode_chunk(bytearray(blob), SECRET, "model-a", "k", ids, layout())
    assert same(decode_chunk(bytearray(blob), SECRET, "model-b", "k", ids, layout()), chunk(3))


def test_full_disk_fails_the_write_only(tmp_path, monkeypatch, caplog):
    """ENOSPC while writing: the chunk is not stored, no partial or temporary file is left, the
    writer keeps working once there is room again."""
    import radixlm.cache.storage as storage_mod

    stats = HiCacheStats()
    s = store(tmp_path, stats=stats)
    real_write_new = storage_mod.write_new

    def full_disk(dir_fd, name, data):
        real_write_new(dir_fd, name, data[: len(data) // 3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage_mod, "write_new", full_disk)
    ids = list(range(C))
    assert not s.set("k1", ids, chunk(1))
    assert stats.write_errors == 1 and "No space left" in caplog.text
    assert chunk_files(tmp_path) == [] and not s.exists("k1")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    monkeypatch.undo()
    assert s.set("k1", ids, chunk(1)) and same(s.get("k1", ids), chunk(1))


def chunk_files(d) -> list[str]:
    return sorted(f for f in os.listdir(d) if f.endswith(".kv"))


def dir_bytes(d) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in chunk_files(d))


def test_size_bound_drops_least_recently_used(tmp_path):
    ids = list(range(C))
    one = len(
        encode_chunk(SECRET, "model-a", "k0", ids, chunk(0), owner="0" * 12 + "-0")
    )  # as the store writes
    s = store(tmp_path, max_bytes=10 * one)
    for i in range(10):
        s.set(f"k{i}", ids, chunk(i))
    for i in range(10):
        os.utime(s.path(f"k{i}"), (100 + i, 100 + i))
    s.close()
    s = store(tmp_path, max_bytes=10 * one)  # the LRU order survives a restart (file times)
    assert same(s.get("k0", ids), chunk(0))  # k0 used again: k1 is now the oldest
    s.set("k10", ids, chunk(10))
    # Past the bound, least recently used files go until 90% of it is used (then 10% of it can be
    # written before the directory is recounted again).
    assert [s.exists(f"k{i}") for i in range(11)] == [True, False, False] + [True] * 8
    assert s.bytes == dir_bytes(tmp_path) == 9 * one


def test_io_shares_reads_and_writes_in_background(tmp_path):
    stats = HiCacheStats()
    s = store(tmp_path, stats=stats)
    # The writer waits until both writes are asked for: on a loaded machine it could otherwise
    # finish the first before the second arrives (then there is nothing pending to share).
    both_asked, store_set = threading.Event(), s.set
    s.set = lambda *a: both_asked.wait(30) and store_set(*a)
    io = HiCacheIO(s, stats)
    ids = list(range(C))
    assert io.write("k1", ids, chunk(1)) and io.write(
        "k1", ids, chunk(1)
    )  # the second is pending already
    both_asked.set()
    io.wait_writes()
    assert stats.l3_chunks_written == 1
    f1, f2 = io.read("k1", ids), io.read("k1", ids)
    assert f1 is f2 and same(f1.result(), chunk(1))
    io.forget(["k1"])
    assert io.read("k1", ids) is not f1
    io.close()
