"""--crash-dump-folder (SGLang's): when the scheduler dies, the requests of the last minutes
(finished, and the one still streaming) are in FOLDER/<hostname>/crash_dump_<time>.json, 0600,
without the admin key (given on the command line) or a cache_salt."""

import json
import os
import signal
import stat
import threading

import requests

from radixlm.server.process import ServerProcess
from tests.server_faults import stream_events, wait_until

KEY = "api-key-that-stays-out-0123"
SALT = "a-tenant-salt-never-dumped"
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")


def test_scheduler_killed_dumps_the_last_requests(tiny_model_dir, tmp_path):
    folder = tmp_path / "crash"
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        *TINY,
        "--crash-dump-folder",
        str(folder),
        "--admin-api-key",
        KEY,
    )
    try:
        sent = [
            {"text": "The first finished request", "sampling_params": {"max_new_tokens": 3}},
            {
                "text": "A second one, salted",
                "sampling_params": {"max_new_tokens": 5},
                "cache_salt": SALT,
                "rid": "salted-one",
            },
        ]
        done = [requests.post(s.url + "/generate", json=b, timeout=60).json() for b in sent]
        running_body = {
            "text": "Still streaming when the scheduler dies",
            "rid": "in-flight",
            "sampling_params": {"max_new_tokens": 900, "ignore_eos": True},
        }
        stream = {}
        t = threading.Thread(target=stream_events, args=(s.url, running_body, stream))
        t.start()
        assert wait_until(lambda: len(stream.get("events", [])) >= 3, 30)
        pid = requests.get(s.url + "/get_server_info", timeout=10).json()["scheduler_pid"]
        os.kill(pid, signal.SIGKILL)
        t.join(timeout=30)
        assert s.proc.wait(timeout=30) == 1  # the server exits as before, after writing the dump
    finally:
        s.stop()
    hosts = os.listdir(folder)
    assert len(hosts) == 1
    (name,) = os.listdir(folder / hosts[0])
    path = folder / hosts[0] / name
    assert name.startswith("crash_dump_") and name.endswith(".json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    raw = path.read_text()
    assert KEY not in raw and SALT not in raw
    dump = json.loads(raw)
    assert "the scheduler process died" in dump["reason"]
    assert (
        dump["server_args"]["admin_api_key"] == "***"
        and "--admin-api-key ***" in dump["launch_command"]
    )
    reqs = dump["requests"]
    assert [r["finished"] for r in reqs] == [True, True, False]
    for r, body, out in zip(reqs, sent, done):
        assert (
            r["obj"]["text"] == body["text"]
            and r["obj"]["sampling_params"] == body["sampling_params"]
        )
        assert r["out"]["text"] == out["text"] and r["out"]["output_ids"] == out["output_ids"]
        assert r["rid"] == out["meta_info"]["id"] and r["error"] is None
        assert r["created_time"] <= r["finished_time"]
    assert reqs[1]["obj"]["cache_salt"] == "***"
    running = reqs[2]
    assert running["rid"] == "in-flight" and running["obj"]["text"] == running_body["text"]
    # Its output so far: at least what the client saw (the dump may hold a chunk still on its way).
    seen = json.loads(stream["events"][-3])[
        "output_ids"
    ]  # the last output before the error event and [DONE]
    assert (
        running["out"]["output_ids"][: len(seen)] == seen
        and running["out"]["meta_info"]["finish_reason"] is None
    )
