"""Tensor parallelism inside the server's other features: `--dp 2 --tp-size 2` is one endpoint whose
router sees one worker per replica (each a TP group) and answers with TP=1's greedy tokens; with
`--restart-on-failure` a killed rank brings up a new group that serves the same outputs, and the
old group's ranks are gone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psutil
import requests

from radixlm.server.process import ServerProcess
from tests.server_faults import engine_processes, health_status, stop_leaving_nothing, wait_until

PROMPTS = ["The capital of France is", "def fib(n):", "One, two, three,"]
MORE = [f"{p} (take {k})" for k in range(2) for p in PROMPTS]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def _tp1_outputs(engine, prompts: list[str] = PROMPTS) -> list[list[int]]:
    """TP=1's answers: the session's plain engine on the tiny Llama (tests/conftest.py)."""
    return [o["output_ids"] for o in engine.generate(prompts, GREEDY)]


def _generate(url: str, prompts: list[str] = PROMPTS) -> list[list[int]]:
    r = requests.post(
        url + "/generate", json={"text": prompts, "sampling_params": GREEDY}, timeout=120
    )
    assert r.status_code == 200, r.text
    return [o["output_ids"] for o in r.json()]


def _ranks(server_pid: int) -> list[psutil.Process]:
    """The server's scheduler ranks and its detokenizer."""
    return engine_processes(server_pid)


def test_dp2_tp2_router_sees_one_worker_per_replica(tiny_model_dir, tiny_engine):
    want_more = _tp1_outputs(tiny_engine, MORE)
    srv = ServerProcess(
        "--dp",
        "2",
        "--tp-size",
        "2",
        "--num-threads",
        "1",
        "--model-path",
        tiny_model_dir,
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
    )
    try:
        workers = requests.get(srv.url + "/list_workers", timeout=5).json()["workers"]
        assert len(workers) == 2 and all(w["healthy"] for w in workers)
        infos = requests.get(srv.url + "/get_server_info", timeout=10).json()["workers"]
        assert sorted(infos) == sorted(w["url"] for w in workers)
        assert [v["body"]["tp_size"] for v in infos.values()] == [
            2,
            2,
        ]  # each replica is a TP group of 2
        # through the router: sent together, the requests spread over both replicas (least loaded)
        with ThreadPoolExecutor(len(MORE)) as pool:
            got = list(pool.map(lambda text: _generate(srv.url, [text])[0], MORE))
        assert got == want_more
        routed = [
            w["routed"]
            for w in requests.get(srv.url + "/list_workers", timeout=5).json()["workers"]
        ]
        assert len(routed) == 2 and all(n >= 1 for n in routed), routed
    finally:
        stop_leaving_nothing(srv, timeout=20)


def test_tp2_restart_on_failure_starts_a_new_group(tiny_model_dir, tiny_engine):
    want = _tp1_outputs(tiny_engine)
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--tp-size",
        "2",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--restart-on-failure",
        "--enable-invariant-checks",
    )
    try:
        assert _generate(s.url) == want
        info = requests.get(s.url + "/get_server_info", timeout=10).json()
        old = engine_processes(s.proc.pid)
        (rank1,) = [
            p
            for p in _ranks(s.proc.pid)
            if p.pid not in (info["scheduler_pid"], info["detokenizer_pid"])
        ]
        rank1.kill()

        def restarted() -> bool:
            return (
                health_status(s.url) == 200
                and requests.get(s.url + "/get_server_info", timeout=10)
                .json()
                .get("engine_restarts")
                == 1
            )

        assert wait_until(restarted, 120, 0.2), (
            "the TP group did not come back: " + s.output()[-2000:]
        )
        info2 = requests.get(s.url + "/get_server_info", timeout=10).json()
        assert info2["tp_size"] == 2 and info2["scheduler_pid"] != info["scheduler_pid"]
        assert _generate(s.url) == want
        _, alive = psutil.wait_procs(old, timeout=15)
        assert not alive, alive  # every process of the old group stopped
        assert s.proc.poll() is None
    finally:
        stop_leaving_nothing(s)
