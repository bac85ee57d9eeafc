"""A local `mooncake_master` (Mooncake Store's master with its HTTP metadata server) on free ports,
and the MOONCAKE_* environment that points radixlm servers at it: for the shared-L3 benchmark and
tests (PyPI's mooncake-transfer-engine-non-cuda provides the binary)."""

from __future__ import annotations

import subprocess
import time

import requests

from radixlm.server.process import free_port


class MooncakeMaster:
    def __init__(self, segment_bytes: int = 64 << 20):
        self.rpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.segment_bytes = segment_bytes  # what each server lends the pool
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "mooncake_master",
                "--enable_http_metadata_server=1",
                f"--rpc_port={self.rpc}",
                f"--http_metadata_server_port={self.http}",
                f"--metrics_port={self.metrics}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{self.http}/metadata?key=x", timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.2)
        self.kill()
        raise TimeoutError("mooncake_master did not start in 30 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def env(self, storage_key: str) -> dict[str, str]:
        return {
            "MOONCAKE_MASTER": f"127.0.0.1:{self.rpc}",
            "MOONCAKE_TE_META_DATA_SERVER": f"http://127.0.0.1:{self.http}/metadata",
            "MOONCAKE_PROTOCOL": "tcp",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(self.segment_bytes),
            "MOONCAKE_LOCAL_BUFFER_SIZE": str(16 << 20),
            "RADIXLM_HICACHE_STORAGE_KEY": storage_key,
        }
