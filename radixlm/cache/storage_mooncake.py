"""`--hicache-storage-backend mooncake`: the hierarchical cache's L3 in a Mooncake Store, SGLang's
main shared KV pool, so that servers of the same model read each other's chunks.

Configured as SGLang configures it, in its order: --hicache-storage-backend-extra-config's JSON when
it names `master_server_address` (its keys: `master_server_address`, `metadata_server`, `protocol`,
`device_name`, `local_hostname`, `global_segment_size`, `local_buffer_size`; sizes in bytes or as
"4gb"; a key left out takes its default, not the environment's), else the JSON file
SGLANG_HICACHE_MOONCAKE_CONFIG_PATH names (the same keys), else the environment: MOONCAKE_MASTER
(the master's HOST:PORT), MOONCAKE_TE_META_DATA_SERVER (the transfer engine's metadata server,
`http://HOST:PORT/metadata` for the master's own, or `P2PHANDSHAKE`), MOONCAKE_PROTOCOL (`tcp`,
`rdma`), MOONCAKE_DEVICE (RDMA devices), MOONCAKE_LOCAL_HOSTNAME, MOONCAKE_GLOBAL_SEGMENT_SIZE
(bytes this server lends to the pool) and MOONCAKE_LOCAL_BUFFER_SIZE. Each chunk is stored as the
file backend writes it (storage_codec.py: a header and a MAC over the model key, the chunk key and
its tokens, with the storage key) under a name that is an HMAC of its chunk key, so the store learns
nothing of the prompts, and a chunk that is missing, truncated, forged or of another model is a miss
(counted in `corrupt_chunks`; removed where the store allows it, replaced when the chunk is stored
again). The servers sharing a store must share the storage key (--hicache-storage-key or
RADIXLM_HICACHE_STORAGE_KEY): there is no directory to keep one in. A master that is gone makes
every call a miss or an unstored chunk (counted, logged once), never a failed request: once a call
finds it gone, the L3 is skipped for DOWN_SECONDS before it is asked again (without the master a get
or put waits some 4 s in the client), and the servers store and share again once it is back.
"""

from __future__ import annotations

import hashlib
import os
import time

from radixlm.cache.kv_data import KVData
from radixlm.cache.storage import HiCacheStorage, chunk_name, report_once
from radixlm.cache.storage_codec import ChunkLayout, StorageError, decode_chunk, encode_chunk

# After a call finds the master unreachable, calls are misses (no store) for this long before the
# next one asks it again: without the master a get or put waits ~4 s in the client each time.
DOWN_SECONDS = 5.0

ENV_DEFAULTS = {
    "MOONCAKE_MASTER": None,  # required
    "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE",
    "MOONCAKE_PROTOCOL": "tcp",
    "MOONCAKE_DEVICE": "",
    "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(1 << 30),
    "MOONCAKE_LOCAL_BUFFER_SIZE": str(64 << 20),
}


# SGLang's config keys (extra config, config file) and the variable each stands for.
CONFIG_KEYS = {
    "master_server_address": "MOONCAKE_MASTER",
    "metadata_server": "MOONCAKE_TE_META_DATA_SERVER",
    "protocol": "MOONCAKE_PROTOCOL",
    "device_name": "MOONCAKE_DEVICE",
    "local_hostname": "MOONCAKE_LOCAL_HOSTNAME",
    "global_segment_size": "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "local_buffer_size": "MOONCAKE_LOCAL_BUFFER_SIZE",
}
CONFIG_PATH_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
SIZES = ("MOONCAKE_GLOBAL_SEGMENT_SIZE", "MOONCAKE_LOCAL_BUFFER_SIZE")


def mooncake_env(
    environ=os.environ, store: bool = True, extra_config: dict | None = None
) -> dict[str, str]:
    """The MOONCAKE_* settings, defaults filled in (SGLang's names and order: the extra config, the
    config file, the environment; PD's transfer engine reads the environment's, store=False: no
    master); ValueError naming what is missing or bad."""
    if extra_config and extra_config.get("master_server_address") is not None:
        env = _from_config(extra_config, "hicache_storage_backend_extra_config")
    elif store and environ.get(CONFIG_PATH_ENV):
        env = _from_config(_read_config_file(environ[CONFIG_PATH_ENV]), CONFIG_PATH_ENV)
    else:
        if extra_config:
            raise ValueError(
                "hicache_storage_backend_extra_config: master_server_address is required"
                " (SGLang reads the extra config only with it)"
            )
        env = {k: environ.get(k, v) for k, v in ENV_DEFAULTS.items()}
    if store and not env["MOONCAKE_MASTER"]:
        raise ValueError(
            "hicache_storage_backend mooncake needs MOONCAKE_MASTER (the master's HOST:PORT)"
        )
    for k in SIZES:
        if not env[k].isdigit() or int(env[k]) <= 0:
            raise ValueError(f"{k} must be a positive number of bytes, got {env[k]!r}")
    return env


def _from_config(config: dict, where: str) -> dict[str, str]:
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r} (radixlm reads {', '.join(CONFIG_KEYS)})"
        )
    env = dict(ENV_DEFAULTS)
    for key, var in CONFIG_KEYS.items():
        if key in config:
            value = config[key]
            if var in SIZES:
                value = _size(value, f"{where}: {key}")
            elif not isinstance(value, str):
                raise ValueError(f"{where}: {key} must be a string, got {value!r}")
            env[var] = str(value)
    return env


def _size(value, what: str) -> int:
    """Bytes, as SGLang reads global_segment_size: an integer, or a string of one or of "<n>gb"."""
    text = str(value).strip().lower() if isinstance(value, (int, str)) else ""
    scale = 2**30 if text.endswith("gb") else 1
    digits = text.removesuffix("gb").strip()
    if isinstance(value, bool) or not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"{what} must be a positive number of bytes or '<n>gb', got {value!r}")
    return int(digits) * scale


def _read_config_file(path: str) -> dict:
    import json

    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{CONFIG_PATH_ENV}: cannot read {path!r} as JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{CONFIG_PATH_ENV}: {path!r} must hold a JSON object")
    return config


class HiCacheMooncake(HiCacheStorage):
    def __init__(
        self,
        directory: str,  # (the file backend's; unused here)
        model_key_: str,
        layout: ChunkLayout,
        max_bytes: int = 0,  # (the pool's size is what the servers lend it: MOONCAKE_*_SIZE)
        stats=None,
        storage_key: str | None = None,
        extra_config: dict | None = None,
    ):
        if storage_key is None:
            raise ValueError(
                "hicache_storage_backend mooncake needs a storage key shared by the servers"
                " (--hicache-storage-key or RADIXLM_HICACHE_STORAGE_KEY): they verify each"
                " other's chunks with it"
            )
        env = mooncake_env(extra_config=extra_config)
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise ValueError(
                "hicache_storage_backend mooncake needs Mooncake's Python package"
                f" (pip install mooncake-transfer-engine-non-cuda, or its CUDA build): {e}"
            ) from None
        self.model_key, self.layout, self.stats = model_key_, layout, stats
        self.secret = hashlib.sha256(b"radixlm-hicache-key\0" + storage_key.encode()).digest()
        self._reported: set[str] = set()
        self._written: set[str] = set()  # this server's names: what clear() removes
        self._down_until = 0.0
        self.store = MooncakeDistributedStore()
        rc = self.store.setup(
            env["MOONCAKE_LOCAL_HOSTNAME"],
            env["MOONCAKE_TE_META_DATA_SERVER"],
            int(env["MOONCAKE_GLOBAL_SEGMENT_SIZE"]),
            int(env["MOONCAKE_LOCAL_BUFFER_SIZE"]),
            env["MOONCAKE_PROTOCOL"],
            env["MOONCAKE_DEVICE"],
            env["MOONCAKE_MASTER"],
        )
        if rc != 0:
            raise ValueError(
                f"hicache_storage_backend mooncake: cannot join the store at"
                f" MOONCAKE_MASTER={env['MOONCAKE_MASTER']} (setup returned {rc})"
            )

    def name(self, key: str) -> str:
        return chunk_name(self.secret, key)

    def _reachable(self) -> bool:
        """False while the master is known to be gone (DOWN_SECONDS after a call saw it), and
        when a health check now finds it gone."""
        if time.monotonic() < self._down_until:
            return False
        try:
            ok = self.store.health_check() == 0
        except Exception:
            ok = False
        if not ok:
            self._gone("the Mooncake master is unreachable")
        return ok

    def _gone(self, why: str) -> None:
        self._down_until = time.monotonic() + DOWN_SECONDS
        self._report("read_errors", f"{why}: the L3 is skipped (misses) until it answers again")

    def exists(self, key: str) -> bool:
        if not self._reachable():
            return False
        try:
            rc = self.store.is_exist(self.name(key))
        except Exception as e:
            rc, why = -1, str(e)
        else:
            why = f"is_exist returned {rc}"
        if rc < 0:
            self._gone(f"mooncake: {why}")
        return rc == 1

    def get(self, key: str, token_ids: list[int]) -> KVData | None:
        if not self._reachable():
            return None
        name = self.name(key)
        try:
            value = self.store.get(name)
        except Exception as e:
            self._gone(f"mooncake get failed: {e}")
            return None
        if not value:  # absent
            return None
        try:
            blob = bytearray(value)  # decode_chunk's tensors share a writable buffer
            return decode_chunk(blob, self.secret, self.model_key, key, token_ids, self.layout)
        except StorageError as e:
            self._report("corrupt_chunks", f"skipping stored KV chunk {name}: {e} (removed)")
            self._remove(name)
            return None

    def set(self, key: str, token_ids: list[int], data: KVData) -> bool:
        if not self.layout.fits(data):
            raise ValueError(f"a KV chunk of another layout than {self.layout}")
        if not self._reachable():
            self._report("write_errors", "a KV chunk not stored: the Mooncake master is gone")
            return False
        name = self.name(key)
        blob = encode_chunk(self.secret, self.model_key, key, token_ids, data)
        try:
            rc = self.store.upsert(name, blob)  # replaces a forged or stale object
        except Exception as e:
            rc = e
        if rc != 0:
            self._report("write_errors", f"mooncake put of a KV chunk failed ({rc})")
            return False
        self._written.add(name)
        return True

    def clear(self) -> None:
        """Remove the chunks this server stored (others' stay)."""
        for name in list(self._written):
            self._remove(name)
        self._written.clear()

    def _remove(self, name: str) -> None:
        try:
            self.store.remove(name)
        except Exception as e:
            self._report("write_errors", f"mooncake remove failed: {e}")

    def _report(self, counter: str, message: str) -> None:
        report_once(self._reported, self.stats, counter, message)

    def close(self) -> None:
        try:
            self.store.close()
        except Exception:  # closing a client whose master is gone
            pass
