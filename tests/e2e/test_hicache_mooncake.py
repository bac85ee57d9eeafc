"""The hierarchical cache's L3 in a Mooncake Store (`--hicache-storage-backend mooncake`, issue 65),
against a real `mooncake_master` over TCP (PyPI's mooncake-transfer-engine-non-cuda; Debian's
libibverbs1 librdmacm1 libnuma1, which .ci/run installs): a prompt answered by one server is read
from the store by another that never saw it, with the same tokens; chunks forged under their names
(garbage, another storage key's, truncated) are misses; with the master killed both servers keep
answering 200, and once it is back they store and share chunks again. One of the two servers reads
its settings from --hicache-storage-backend-extra-config (SGLang's JSON), the other from the
MOONCAKE_* variables."""

from __future__ import annotations

import json
import time

import pytest
import requests
import torch

from radixlm.bench.mooncake_master import MooncakeMaster
from radixlm.cache.storage_mooncake import CONFIG_KEYS
from radixlm.server.process import ServerProcess
from tests.mooncake import requires_mooncake

pytestmark = requires_mooncake

CHUNK = 16
N_CHUNKS = 6
IDS = [1000 + 37 * i for i in range(N_CHUNKS * CHUNK + 4)]  # 6 full chunks and 4 tokens more
KEY = "mooncake-storage-key-0123"
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture
def master():
    """A master per test: a stopped server's segment stays registered in its master until the
    client's lease runs out, and chunks placed there meanwhile fail to store."""
    m = MooncakeMaster()
    yield m
    m.kill()


def serve(model: str, master: MooncakeMaster, extra_config: bool = False) -> ServerProcess:
    """A server of the store, configured by the MOONCAKE_* variables, or by SGLang's
    --hicache-storage-backend-extra-config (its keys, the variables unset)."""
    env, flags = master.env(KEY), []
    if extra_config:
        config = {key: env.pop(var) for key, var in CONFIG_KEYS.items() if var in env}
        flags = ["--hicache-storage-backend-extra-config", json.dumps(config)]
        env.update({var: "" for var in CONFIG_KEYS.values()})  # none left to fall back on
    return ServerProcess(
        "--model-path",
        model,
        "--num-threads",
        "1",
        "--max-total-tokens",
        "2000",
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "mooncake",
        "--hicache-storage-chunk-size",
        str(CHUNK),
        "--enable-invariant-checks",
        *flags,
        env=env,
    )


def generate(url: str, ids: list[int]) -> dict:
    r = requests.post(
        url + "/generate", json={"input_ids": ids, "sampling_params": GREEDY}, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()


def hicache(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"]["hicache"]


def wait_stored(url: str, n: int) -> None:
    deadline = time.time() + 60
    while hicache(url)["l3_chunks_written"] < n:
        assert time.time() < deadline, "the chunks were not stored in 60 s"
        time.sleep(0.1)


def test_servers_share_chunks_and_survive_the_master(tiny_model_dir, master):
    a, b = serve(tiny_model_dir, master), serve(tiny_model_dir, master, extra_config=True)
    try:
        ref = generate(a.url, IDS)
        assert ref["meta_info"]["cached_tokens"] == 0
        wait_stored(a.url, N_CHUNKS)
        out = generate(b.url, IDS)  # b never saw it: its chunks come from the store
        assert out["meta_info"]["cached_tokens"] >= 2 * len(IDS) // 3
        assert out["output_ids"] == ref["output_ids"]

        other = [2000 + 11 * i for i in range(3 * CHUNK + 2)]
        want = generate(a.url, other)["output_ids"]
        master.kill()
        assert generate(a.url, other)["output_ids"] == want
        assert generate(b.url, other)["output_ids"] == want  # b computes it: no store to read
        assert generate(b.url, IDS)["output_ids"] == ref["output_ids"]

        master.start()  # back (empty): the servers store and share again
        third = [3000 + 7 * i for i in range(3 * CHUNK + 2)]
        written = hicache(a.url)["l3_chunks_written"]
        deadline = time.time() + 60
        while True:
            first = generate(a.url, third)
            time.sleep(0.5)
            if hicache(a.url)["l3_chunks_written"] >= written + 3:
                break
            assert time.time() < deadline, "no chunk stored after the master came back"
            requests.post(a.url + "/flush_cache", timeout=30)
        # b reads them from the store once its client is back with the master (a loaded machine
        # may take a while); b's own tiers are flushed between tries, so a hit is the store's
        deadline = time.time() + 60
        while True:
            again = generate(b.url, third)
            assert again["output_ids"] == first["output_ids"]
            if again["meta_info"]["cached_tokens"] >= 3 * CHUNK:
                break
            assert time.time() < deadline, "b read nothing from the store once the master was back"
            requests.post(b.url + "/flush_cache?level=l2", timeout=30)  # device and host
            time.sleep(0.5)
    finally:
        a.stop()
        b.stop()


def test_forged_chunks_are_misses(master, monkeypatch):
    """The backend itself against the store: a chunk reads back; garbage, a truncated copy and a
    chunk written with another storage key, each under the chunk's name, are misses (counted in
    corrupt_chunks), and storing the chunk again replaces them."""
    from radixlm.cache.kv_data import KVData
    from radixlm.cache.storage_codec import ChunkLayout
    from radixlm.cache.storage_mooncake import HiCacheMooncake

    for k, v in master.env(KEY).items():
        monkeypatch.setenv(k, v)

    class Stats:
        counts: dict = {}

        def count(self, name):
            self.counts[name] = self.counts.get(name, 0) + 1

    layout = ChunkLayout(2, 2, 8, torch.float16, 4, 8)
    stats = Stats()
    ours = HiCacheMooncake("", "model-a", layout, stats=stats, storage_key=KEY)
    theirs = HiCacheMooncake("", "model-a", layout, storage_key="another-storage-key-0000")
    try:
        tokens = [5, 6, 7, 8]
        g = torch.Generator().manual_seed(0)
        k = torch.randn(2, 4, 2, 8, generator=g).half()
        data = KVData(k, torch.randn(2, 4, 2, 8, generator=g).half())
        assert ours.set("chunk-1", tokens, data) and ours.exists("chunk-1")
        got = ours.get("chunk-1", tokens)
        assert got is not None and torch.equal(got.k, data.k) and torch.equal(got.v, data.v)
        assert ours.get("chunk-1", [5, 6, 7, 9]) is None  # other tokens under the key: a miss
        name = ours.name("chunk-1")
        blob = bytes(ours.store.get(name))
        theirs.set("chunk-1", tokens, data)  # another key: its own name, not ours
        forged = {
            "garbage": bytes(range(256)) * 8,
            "truncated": blob[: len(blob) // 2],
            "another key": bytes(theirs.store.get(theirs.name("chunk-1"))),
        }
        for why, value in forged.items():
            assert ours.store.upsert(name, value) == 0
            assert ours.get("chunk-1", tokens) is None, why
        assert stats.counts.get("corrupt_chunks", 0) >= 4
        assert ours.set("chunk-1", tokens, data)  # stored anew: it replaces the forged one
        assert torch.equal(ours.get("chunk-1", tokens).k, data.k)
    finally:
        ours.close()
        theirs.close()


def test_what_it_needs_is_named(monkeypatch):
    """No storage key, no MOONCAKE_MASTER, a bad size: one line naming what is missing."""
    from radixlm.cache.storage_codec import ChunkLayout
    from radixlm.cache.storage_mooncake import HiCacheMooncake

    layout = ChunkLayout(2, 2, 8, torch.float16, 4, 8)
    for k in ("MOONCAKE_MASTER", "MOONCAKE_GLOBAL_SEGMENT_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="storage key"):
        HiCacheMooncake("", "m", layout, storage_key=None)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        HiCacheMooncake("", "m", layout, storage_key=KEY)
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:1")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "lots")
    with pytest.raises(ValueError, match="MOONCAKE_GLOBAL_SEGMENT_SIZE"):
        HiCacheMooncake("", "m", layout, storage_key=KEY)
