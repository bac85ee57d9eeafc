"""The pieces of the request log and the crash dump that the e2e tests (test_request_log,
test_crash_dump) cannot reach cheaply: every key flag's value masked on a command line in both
spellings, level 2's cut of long id lists, the crash dump's 5-minute window, a folder that cannot be
written."""

import dataclasses
import json
import logging

import pytest

from radixlm.config import ServerArgs
from radixlm.engine.crash_dump import (
    SECRETS,
    WINDOW_SECONDS,
    CrashDump,
    check_crash_dump_folder,
    masked_argv,
)
from radixlm.engine.request_log import RequestLogConfig, RequestLogger
from radixlm.ipc import GenerateReqInput


def test_every_secret_flag_is_masked_in_both_spellings():
    assert set(SECRETS) == {f.name for f in dataclasses.fields(ServerArgs) if not f.repr}
    assert {"api_key", "admin_api_key", "hicache_storage_key"} <= set(SECRETS)
    argv = [
        "radixlm",
        "serve",
        "--api-key",
        "k1",
        "--admin-api-key=k2",
        "--hicache-storage-key",
        "k3",
        "--port",
        "1",
    ]
    out = masked_argv(argv)
    assert out == [
        "radixlm",
        "serve",
        "--api-key",
        "***",
        "--admin-api-key=***",
        "--hicache-storage-key",
        "***",
        "--port",
        "1",
    ]


def test_level_2_cuts_long_id_lists_in_the_middle(capsys):
    log = RequestLogger(RequestLogConfig(enabled=True, level=2, format="json"))
    ids = list(range(5000))
    logged = log.received(GenerateReqInput(input_ids=ids, rid="r"))
    log.finished(logged, {"text": "x", "output_ids": ids, "meta_info": {"id": "r"}})
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert lines[0]["obj"]["input_ids"] == [*range(1024), "...", *range(5000 - 1024, 5000)]
    assert lines[1]["out"]["output_ids"] == lines[0]["obj"]["input_ids"]
    assert logging.getLogger("radixlm.requests").propagate is False


def test_crash_dump_keeps_five_minutes_and_running_requests(tmp_path, monkeypatch):
    import radixlm.engine.crash_dump as cd

    now = [1000.0]
    monkeypatch.setattr(cd.time, "time", lambda: now[0])
    dump = CrashDump(str(tmp_path), ServerArgs(api_key="secret-key"))
    old = dump.received(GenerateReqInput(text="old", rid="old"))
    dump.finished_request(old, {"text": "o"})
    now[0] += WINDOW_SECONDS + 1
    dump.finished_request(
        dump.received(GenerateReqInput(text="recent", rid="recent")), {"text": "r"}
    )
    dump.received(GenerateReqInput(text="running", rid="running"))
    data = json.load(open(dump.dump("the scheduler process died")))
    assert [(r["rid"], r["finished"]) for r in data["requests"]] == [
        ("recent", True),
        ("running", False),
    ]
    assert data["server_args"]["api_key"] == "***"
    assert CrashDump(str(tmp_path / "empty"), ServerArgs()).dump("nothing ran") is None


def test_a_crash_dump_folder_that_cannot_be_written_is_refused_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="crash_dump_folder"):
        check_crash_dump_folder(str(blocker / "sub"))
