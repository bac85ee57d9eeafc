"""--mem-fraction-static F on CPU: the KV pool gets the RAM available after the weights load less
(1 - F) x the RAM available before (SGLang's formula, RAM for GPU memory), and its pages are
committed as they are written, not at start-up."""

import re

import psutil
import requests

from radixlm.server.process import ServerProcess


def test_pool_from_available_ram(tiny_model_dir):
    fraction = 0.5
    available = psutil.virtual_memory().available
    server = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--num-threads",
        "1",
        "--mem-fraction-static",
        str(fraction),
        "--log-level",
        "info",
    )
    try:
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        pool = info["kv_cache_bytes"]
        # the scheduler's own reading, logged: before and after the weights, in GiB (2 decimals)
        before, after = map(
            float,
            re.search(
                r"mem_fraction_static 0.5: ([\d.]+) GiB available before the weights, "
                r"([\d.]+) GiB after",
                server.output(),
            ).groups(),
        )
        expected = (after - (1 - fraction) * before) * 2**30
        assert abs(pool - expected) <= 0.01 * 2**30 + 2 * pool / info["max_total_num_tokens"]
        # ... which is what this machine had (the server's own processes take some before it reads)
        assert 0.7 * available < before * 2**30 <= 1.05 * available
        assert pool > 0.35 * available  # not the 1 GiB --kv-memory-gb default
        # the pool costs what is written, not its size
        rss = psutil.Process(info["scheduler_pid"]).memory_info().rss
        assert rss < pool / 4, (rss, pool)
        out = requests.post(
            server.url + "/generate",
            timeout=60,
            json={"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
        ).json()
        assert out["meta_info"]["completion_tokens"] == 4
    finally:
        server.stop()
