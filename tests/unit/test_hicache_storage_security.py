"""The L3 file backend against a local attacker, through the files on disk: private modes whatever
the umask, no token ids and no guessable names in the directory, refused directories and key
files, planted files (symlink, FIFO, oversized, wrong layout under a valid MAC, forged header) as
cache misses, and two servers sharing one directory (one byte bound, each flushes its own)."""

from __future__ import annotations

import json
import os
import stat
import struct
import threading

import pytest
import torch

from radixlm.cache.hicache_io import HiCacheIO, HiCacheStats
from radixlm.cache.storage import HiCacheFile
from radixlm.cache.storage_codec import MAGIC, ChunkLayout, encode_chunk
from tests.unit.test_hicache_storage import C, chunk, chunk_files, dir_bytes, layout, same

# Token ids no other bytes in a file are likely to spell.
IDS = [987654321 + 7919 * i for i in range(C)]


def store(d, key="model-a", stats=None, **kw) -> HiCacheFile:
    return HiCacheFile(str(d), key, layout(), stats=stats or HiCacheStats(), **kw)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o000)  # the worst a service manager could hand over
    try:
        d = tmp_path / "new" / "hicache"
        s = store(d)
        assert s.set("k1", IDS, chunk(1))
    finally:
        os.umask(old)
    assert mode(d) == 0o700
    names = os.listdir(d)
    assert ".key" in names and len(chunk_files(d)) == 1
    for name in names:
        assert mode(d / name) == 0o600, name
    assert os.path.getsize(d / ".key") == 32


def test_no_token_ids_or_guessable_names_on_disk(tmp_path):
    s = store(tmp_path)
    s.set("chain-key-1", IDS, chunk(1))
    blobs = (
        b"".join(open(tmp_path / n, "rb").read() for n in os.listdir(tmp_path))
        + "".join(os.listdir(tmp_path)).encode()
    )
    spellings = [
        struct.pack(f"<{C}q", *IDS),
        struct.pack(f"<{C}i", *IDS),
        json.dumps(IDS).encode(),
        ", ".join(map(str, IDS)).encode(),
        str(IDS[0]).encode(),
        struct.pack("<q", IDS[0]),
        struct.pack("<i", IDS[0]),
        b"chain-key-1",
        b"model-a",
    ]
    for needle in spellings:
        assert needle not in blobs, needle
    # The name is an HMAC of the chunk key: without the directory's secret it names nothing.
    assert chunk_files(tmp_path) == [s.name("chain-key-1")]
    other = HiCacheFile(str(tmp_path / "other"), "model-a", layout())
    assert other.name("chain-key-1") != s.name("chain-key-1")


def test_storage_key_option(tmp_path):
    a = store(tmp_path / "a", storage_key="a" * 16)
    assert not os.path.exists(tmp_path / "a" / ".key")  # the given key, no key file
    a.set("k1", IDS, chunk(1))
    os.rename(tmp_path / "a", tmp_path / "b")
    assert same(store(tmp_path / "b", storage_key="a" * 16).get("k1", IDS), chunk(1))
    assert (
        store(tmp_path / "b", storage_key="b" * 16).get("k1", IDS) is None
    )  # another key: nothing


def test_directory_of_another_user_or_writable_by_others_is_refused(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(d, 54321, -1)
        theirs = d
    else:
        theirs = "/"  # root's, as seen by anyone else
    with pytest.raises(ValueError, match="belongs to another user"):
        store(theirs)
    if os.geteuid() == 0:
        os.chown(d, 0, -1)
    for m in (0o777, 0o770, 0o702):
        os.chmod(d, m)
        with pytest.raises(ValueError, match="writable by other users"):
            store(d)
    os.chmod(d, 0o755)  # readable by others (an older radixlm's makedirs): tightened
    store(d)
    assert mode(d) == 0o700


@pytest.mark.parametrize("how", ["symlink", "mode", "size"])
def test_unsafe_key_file_is_refused(tmp_path, how):
    d = tmp_path / "k"
    store(d)
    key = d / ".key"
    if how == "symlink":
        (tmp_path / "attacker-key").write_bytes(b"x" * 32)
        key.unlink()
        key.symlink_to(tmp_path / "attacker-key")
    elif how == "mode":
        os.chmod(key, 0o644)
    else:
        key.write_bytes(b"short")
    with pytest.raises(ValueError, match="key file"):
        store(d)


def plant(s: HiCacheFile, key: str, how: str, tmp_path) -> None:
    path = s.path(key)
    if os.path.lexists(path):
        os.unlink(path)
    if how == "symlink":  # to a valid chunk under another name, or to any file of the victim
        s.set("elsewhere", IDS, chunk(9))
        os.symlink(s.path("elsewhere"), path)
    elif how == "fifo":  # opening it for reading would block until a writer comes
        os.mkfifo(path, 0o600)
    elif how == "oversized":  # a sparse 4 GiB file: read whole, it would cost the memory
        with open(path, "wb") as f:
            f.truncate(4 << 30)
    elif how == "directory":
        os.mkdir(path)
    elif (
        how == "wrong_layout"
    ):  # a valid MAC (an insider with the key) over a chunk of another shape
        other = ChunkLayout(3, 1, 8, torch.float16, C)
        k, v = (torch.randn(3, C, 1, 8).half() for _ in range(2))
        from radixlm.cache.kv_data import KVData

        assert other.fits(KVData(k, v))
        blob = encode_chunk(s.secret, s.model_key, key, IDS, KVData(k, v), s.owner)
        open(path, "wb").write(blob)
    elif how == "forged_header":  # what the format looks like, without the secret
        header = json.dumps(
            {"dtype": "float16", "shape": [3, C, 2, 4], "scales": False, "owner": s.owner}
        ).encode()
        payload = b"\0" * layout().payload_bytes
        open(path, "wb").write(
            MAGIC + struct.pack("<I", len(header)) + header + payload + b"\0" * 32
        )
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["symlink", "fifo", "oversized", "directory", "wrong_layout", "forged_header"]
)
def test_planted_file_is_a_miss(tmp_path, how, caplog):
    stats = HiCacheStats()
    s = store(tmp_path / "d", stats=stats)
    io = HiCacheIO(s, stats)
    s.set("good", IDS, chunk(1))
    plant(s, "k1", how, tmp_path)
    f = io.read("k1", IDS)
    got = f.result(timeout=10)  # a FIFO must not block the reader
    assert got is None
    assert stats.corrupt_chunks + stats.read_errors == 1 and stats.bytes_from_l3 == 0
    assert not os.path.lexists(s.path("k1"))
    assert same(io.read("good", IDS).result(timeout=10), chunk(1))  # the rest is served as ever
    if how == "symlink":
        assert os.path.exists(s.path("elsewhere"))  # the link went, not what it pointed at
    io.close()


def test_failures_are_logged_once_and_counted(tmp_path, caplog):
    stats = HiCacheStats()
    s = store(tmp_path, stats=stats)
    for i in range(5):
        plant(s, f"k{i}", "forged_header", tmp_path)
        assert s.get(f"k{i}", IDS) is None
    assert stats.corrupt_chunks == 5
    assert caplog.text.count("skipping stored KV chunk") == 1


def test_two_servers_share_the_bound_and_flush_their_own(tmp_path):
    """Two stores on one directory (two servers of one model, say --dp 2): their files together stay
    under the bound at every moment, each reads the other's chunks, and /flush_cache?level=l3 on
    one removes only the files it wrote."""
    probe = store(tmp_path / "probe")
    probe.set("p", IDS, chunk(0))
    one = dir_bytes(tmp_path / "probe")
    d = tmp_path / "shared"
    a, b = store(d, max_bytes=10 * one), store(d, max_bytes=10 * one)
    assert a.owner != b.owner
    for i in range(8):
        assert a.set(f"a{i}", IDS, chunk(i)) and b.set(f"b{i}", IDS, chunk(100 + i))
        assert dir_bytes(d) <= 10 * one
    assert b.bytes == dir_bytes(d)  # the shared count, as the last writer saw it
    assert same(a.get("b7", IDS), chunk(107)) and same(b.get("a7", IDS), chunk(7))
    left_a = [i for i in range(8) if a.exists(f"a{i}")]
    left_b = [i for i in range(8) if b.exists(f"b{i}")]
    assert left_a and left_b and len(left_a) + len(left_b) <= 10
    a.clear()
    assert not any(a.exists(f"a{i}") for i in range(8))
    assert [i for i in range(8) if b.exists(f"b{i}")] == left_b  # b's files stay
    assert a.bytes == dir_bytes(d) == len(left_b) * one


def test_restarted_server_takes_back_its_files(tmp_path):
    a = store(tmp_path)
    a.set("k1", IDS, chunk(1))
    other = store(tmp_path)  # a second server, still running
    other.set("k2", IDS, chunk(2))
    a.close()  # a stops
    a2 = store(tmp_path)  # and starts again: a's owner id is free
    assert a2.owner == a.owner
    a2.clear()
    assert not a2.exists("k1") and other.exists("k2")


def test_concurrent_readers_and_writer(tmp_path):
    """The writer thread, two readers and a flush on one store: no error, every read a whole chunk
    or a miss."""
    stats = HiCacheStats()
    s = store(tmp_path, stats=stats, max_bytes=0)
    stop, errors = threading.Event(), []

    def reader():
        while not stop.is_set():
            for i in range(4):
                got = s.get(f"k{i}", IDS)
                if got is not None and not same(got, chunk(i)):
                    errors.append(i)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(20):
        for i in range(4):
            s.set(f"k{i}", IDS, chunk(i))
        s.clear()
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and stats.corrupt_chunks == 0 and stats.read_errors == 0


def test_flush_removes_files_of_an_older_format(tmp_path):
    """Chunks of the format before keyed MACs (token ids in clear) are no server's to serve: a
    flush removes them with the server's own."""
    s = store(tmp_path)
    (tmp_path / ("0" * 64 + ".kv")).write_bytes(b"RLMKV001" + b"\0" * 100)
    s.set("k1", IDS, chunk(1))
    s.clear()
    assert chunk_files(tmp_path) == []


def test_any_backend_failure_is_a_miss(caplog):
    """Whatever a backend does (raises, returns another layout), the tree gets None, not an
    exception in the scheduler's step."""
    from radixlm.cache.kv_data import KVData
    from radixlm.cache.storage import HiCacheStorage

    class Broken(HiCacheStorage):
        layout = layout()

        def get(self, key, token_ids):
            if key == "raise":
                raise RuntimeError("disk on fire")
            return KVData(torch.zeros(3, C, 1, 4).half(), torch.zeros(3, C, 1, 4).half())

        def exists(self, key):
            return True

        def set(self, key, token_ids, data):
            raise RuntimeError("disk on fire")

    stats = HiCacheStats()
    io = HiCacheIO(Broken(), stats)
    assert io.read("raise", IDS).result(timeout=10) is None
    assert io.read("wrong", IDS).result(timeout=10) is None
    assert io.write("k", IDS, chunk(1))
    io.wait_writes(timeout=10)
    assert (stats.read_errors, stats.corrupt_chunks, stats.write_errors) == (1, 1, 1)
    io.close()
