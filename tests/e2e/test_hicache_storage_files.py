"""The hierarchical cache's disk tier through `radixlm serve` and the files on disk (issue 35,
finding 7): the directory and its files are private whatever the umask, they hold no token ids,
and files planted under the chunks' names (symlink, FIFO, oversized, forged header, garbage) are
cache misses: the server keeps serving the same greedy output with the same scheduler process, and
serves from disk again once the chunks are stored anew."""

from __future__ import annotations

import json
import os
import stat
import struct
import time

import requests

from radixlm.server.process import ServerProcess

CHUNK = 16
N_CHUNKS = 6
IDS = [1000 + 37 * i for i in range(N_CHUNKS * CHUNK + 4)]  # 6 full chunks and 4 tokens more


KEY = "storage-key-0123456789"


def serve(model: str, d, *extra: str) -> ServerProcess:
    return ServerProcess(
        "--model-path",
        model,
        "--num-threads",
        "1",
        "--max-total-tokens",
        "2000",
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
        str(d),
        "--hicache-storage-chunk-size",
        str(CHUNK),
        "--enable-invariant-checks",
        *extra,
    )


def generate(url: str) -> dict:
    r = requests.post(
        url + "/generate",
        timeout=120,
        json={
            "input_ids": IDS,
            "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def info(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()


def wait_stored(url: str, n: int) -> None:
    deadline = time.time() + 60
    while info(url)["internal_state"]["hicache"]["l3_chunks_written"] < n:
        assert time.time() < deadline, "the chunks were not stored in 60 s"
        time.sleep(0.1)


def chunk_files(d) -> list[str]:
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".kv"))


def plant(path: str, how: str) -> None:
    os.unlink(path)
    if how == "symlink":
        os.symlink("/etc/passwd", path)
    elif how == "fifo":
        os.mkfifo(path, 0o600)
    elif how == "oversized":
        with open(path, "wb") as f:
            f.truncate(4 << 30)  # sparse: costs no disk, but 4 GiB of memory if read whole
    elif how == "forged_header":  # the format, a header of another shape, no secret
        header = json.dumps(
            {"dtype": "float16", "shape": [2, CHUNK, 7, 3], "scales": False}
        ).encode()
        with open(path, "wb") as f:
            f.write(b"RLMKV002" + struct.pack("<I", len(header)) + header + b"\0" * 4000)
    elif how == "garbage":
        with open(path, "wb") as f:
            f.write(os.urandom(5000))
    else:
        raise AssertionError(how)


def test_files_are_private_and_planted_files_are_misses(tiny_model_dir, tmp_path, monkeypatch):
    d = tmp_path / "hicache"  # created by the server
    old = os.umask(0o000)  # the server's umask would give everyone access to what it creates
    monkeypatch.setenv(
        "RADIXLM_HICACHE_STORAGE_KEY", KEY
    )  # the storage key from the environment...
    try:
        a = serve(tiny_model_dir, d)
    finally:
        os.umask(old)
        monkeypatch.delenv("RADIXLM_HICACHE_STORAGE_KEY")
    try:
        ref = generate(a.url)
        assert ref["meta_info"]["cached_tokens"] == 0
        wait_stored(a.url, N_CHUNKS)
    finally:
        a.stop()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert len(chunk_files(d)) == N_CHUNKS and not os.path.exists(
        d / ".key"
    )  # (a given key: no key file)
    for name in os.listdir(d):
        assert stat.S_IMODE(os.lstat(d / name).st_mode) == 0o600, name
    everything = b"".join(open(d / n, "rb").read() for n in os.listdir(d))
    for needle in (
        struct.pack("<3q", *IDS[:3]),
        struct.pack("<3i", *IDS[:3]),
        json.dumps(IDS[:3])[1:-1].encode(),
        b"token_ids",
    ):
        assert needle not in everything, needle

    b = serve(
        tiny_model_dir, d, "--hicache-storage-key", KEY
    )  # ... or the command line: the same key
    try:
        assert info(b.url)["hicache_storage_key"] == "***"  # never shown
        pid = info(b.url)["scheduler_pid"]
        assert (
            generate(b.url)["meta_info"]["cached_tokens"] == N_CHUNKS * CHUNK
        )  # from disk: the files are good
        stored, corrupt = 0, 0
        for how in ("symlink", "fifo", "oversized", "forged_header", "garbage"):
            assert (
                requests.post(b.url + "/flush_cache?level=l2", timeout=30).status_code == 200
            )  # L1, L2 empty
            for path in chunk_files(d):
                plant(path, how)
            out = generate(b.url)
            assert out["output_ids"] == ref["output_ids"], how
            assert out["meta_info"]["cached_tokens"] == 0, how  # nothing planted was served
            st = info(b.url)
            assert st["scheduler_pid"] == pid, how  # the same scheduler: nothing raised in its step
            hc = st["internal_state"]["hicache"]
            assert hc["corrupt_chunks"] > corrupt, how
            corrupt = hc["corrupt_chunks"]
            assert requests.get(b.url + "/health", timeout=10).status_code == 200
            stored += N_CHUNKS  # the planted files were removed; the recomputed chunks replace them
            wait_stored(b.url, stored)
        assert requests.post(b.url + "/flush_cache?level=l2", timeout=30).status_code == 200
        again = generate(b.url)
        assert (
            again["meta_info"]["cached_tokens"] == N_CHUNKS * CHUNK
            and again["output_ids"] == ref["output_ids"]
        )
    finally:
        b.stop()
