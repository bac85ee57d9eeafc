"""A local `mooncake_master` (Mooncake Store's master with its HTTP metadata server) on free ports,
and the MOONCAKE_* environment that points radixlm servers at it: for the shared-L3 benchmark and
tests (PyPI's mooncake-transfer-engine-non-cuda provides the binary)."""

from __future__ import annotations

import subprocess
import time

from radixlm.server.process import free_port


class MooncakeMaster:
    def __init__(self, segment_bytes: int = 64 << 20, attempts: int = 3):
        self.segment_bytes = segment_bytes  # what each server lends the pool
        self.proc: subprocess.Popen | None = None
        # A free port can be taken by another process (a parallel test's server) before the
        # master binds it; the master then exits, so a new set of ports is tried.
        for attempt in range(attempts):
            self.rpc, self.http, self.metrics = free_port(), free_port(), free_port()
            try:
                self.start()
                return
            except OSError:
                if attempt == attempts - 1:
                    raise

    def start(self) -> None:
        """Starts the master on this object's ports (again, after `kill`) and returns once the
        process itself listens on its RPC and metadata ports."""
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
            if self.proc.poll() is not None:
                raise OSError(
                    f"mooncake_master exited ({self.proc.returncode}): ports"
                    f" {self.rpc}, {self.http}, {self.metrics} in use?"
                )
            if {self.rpc, self.http} <= _listening(self.proc.pid):
                return
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


def _listening(pid: int) -> set[int]:
    """The TCP ports the process listens on (its own sockets, not another process's on the
    same port: what a request to the port cannot tell)."""
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
