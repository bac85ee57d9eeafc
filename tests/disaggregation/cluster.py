"""Prefill, decode and plain tiny-model servers and the PD router, for the disaggregation tests."""

import sys
import time

import requests

from radixlm.server.process import ServerProcess, free_port

GREEDY = {"max_new_tokens": 12, "temperature": 0}


def server(model_dir, *extra, env=None):
    return ServerProcess(
        "--model-path",
        model_dir,
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--chunked-prefill-size",
        "64",
        "--enable-invariant-checks",
        *extra,
        env=env,
    )


def prefill(model_dir, backend="tcp", *extra, env=None):
    # The bootstrap port is picked free here and bound by the server's scheduler a few seconds
    # later: another worker's server or an outgoing connection can take it in between (a fresh
    # clone's run hit it once), so a start that fails on that port tries another.
    for attempt in range(3):
        port = free_port()
        try:
            s = server(
                model_dir,
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-transfer-backend",
                backend,
                "--disaggregation-bootstrap-port",
                str(port),
                "--disaggregation-debug-checksum",
                *extra,
                env=env,
            )
        except RuntimeError as e:
            if "Address already in use" not in str(e) or attempt == 2:
                raise
            continue
        s.bootstrap_port = port
        return s


def decode(model_dir, backend="tcp", *extra):
    return server(
        model_dir,
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        backend,
        "--disaggregation-debug-checksum",
        *extra,
    )


def router(prefills, decodes, *extra):
    def cmd(port):
        argv = [
            sys.executable,
            "-m",
            "radixlm.cli",
            "router",
            "--pd-disaggregation",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--health-check-interval-secs",
            "60",
        ]
        for p in prefills:
            argv += ["--prefill", p.url, str(p.bootstrap_port)]
        for d in decodes:
            argv += ["--decode", d.url]
        return argv + list(extra)

    return ServerProcess(command=cmd, name="the PD router")


def state(s) -> dict:
    return requests.get(s.url + "/get_server_info", timeout=10).json()["internal_state"]


def pool_at_baseline(st: dict) -> bool:
    """No request holds KV: every slot free or an unlocked cache entry, every request slot free."""
    return (
        st["available_kv_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"]
        and st["protected_tokens"] == 0
        and st["req_slots_free"] == st["req_slots_total"]
    )


def wait_for(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
